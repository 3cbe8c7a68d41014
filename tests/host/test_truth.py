"""The watcher says what is true now: bad data is a clear message (never a traceback), and nothing else changes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from runner.queue import STATES
from runner.readers import terminal_safe
from tests.conftest import REPO, RunnerProcess, wait_for, write_job

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("no_hosts")


def _ts(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _live_root(tmp_path: Path, pid: int) -> Path:
    """A queue root as a live runner leaves it: status.json with a fresh heartbeat and PID."""
    root = tmp_path / "root"
    for state in STATES:
        (root / state).mkdir(parents=True, exist_ok=True)
    now = time.time()
    status = {
        "runner": {"pid": pid, "heartbeat": now, "tick": 3, "version": "t", "root": str(root)},
        "running": [],
        "queued": [],
        "lanes": {"cpu": {"state": "idle", "since": now}},
        "lane_order": ["cpu"],
        "counts": {s: 0 for s in STATES},
    }
    (root / "status.json").write_text(json.dumps(status))
    (root / "events.jsonl").write_text(json.dumps({"ts": _ts(now), "job": "-", "event": "runner-start"}) + "\n")
    return root


def _append(root: Path, *lines: str) -> None:
    with open(root / "events.jsonl", "a") as handle:
        handle.write("".join(line + "\n" for line in lines))


def _watch(root: Path, state: Path) -> tuple[int, str, str]:
    result = cli.invoke(app, ["watch", str(root), "--once", "--state", str(state), "--idle", "99999"])
    return result.exit_code, result.stdout, result.stderr


def test_a_malformed_event_is_skipped_once_and_the_watcher_moves_on(tmp_path: Path, stand_in: int) -> None:
    root, state = _live_root(tmp_path, stand_in), tmp_path / "w.json"
    assert _watch(root, state)[0] == 0
    _append(
        root,
        json.dumps({"ts": _ts(time.time()), "job": "z", "event": "failed", "tail": [5]}),
        json.dumps({"event": "done", "ts": _ts(time.time())}),
        "not json {",
    )
    code, out, err = _watch(root, state)
    assert code == 0, out + err
    assert "internal error" not in out + err
    assert "skipped 3 malformed events" in err and "'tail' holds something that is not a string" in err
    assert (
        "a 'done' event with no 'job'" in err
        and "not JSON" in err
        and "events.jsonl line 2:" in err
        and "line 4: not JSON" in err
    )
    offset = json.loads(state.read_text())["offset"]
    assert offset == (root / "events.jsonl").stat().st_size  # the offset moved past them
    # Said once; a good event after them still alerts.
    _append(root, json.dumps({"ts": _ts(time.time()), "job": "y.job", "event": "failed", "tail": ["boom"]}))
    code, out, err = _watch(root, state)
    assert code == 10 and "failed y.job" in out and "boom" in out and "skipped" not in err
    status = cli.invoke(app, ["status", str(root)])
    assert status.exit_code == 0 and "internal error" not in status.stdout
    assert "skipped 3 malformed events" in status.stdout


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("[1]", "is corrupt: it is a list, not an object"),
        ('{"runner": 5, "running": "x"}', "is corrupt: 'runner' is an int, not an object"),
        ('{"runner": {"pid": 1}, "running": "x"}', "is corrupt: running is a string, not a list"),
        ('{"running": [{"job": "a.job", "lane": "cpu", "elapsed_s": "1"}]}', "running[0].elapsed_s is a string"),
        ("garbage", "exists but is not readable JSON"),
    ],
)
def test_a_corrupt_status_json_is_said_to_be_corrupt(tmp_path: Path, content: str, said: str, stand_in: int) -> None:
    root = _live_root(tmp_path, stand_in)
    (root / "status.json").write_text(content)
    result = cli.invoke(app, ["status", str(root)])
    assert result.exit_code == 1, result.stdout
    assert said in result.stdout and "status.json" in result.stdout
    assert "never" not in result.stdout and "internal error" not in result.stdout
    code, out, err = _watch(root, tmp_path / "w.json")
    assert code == 16 and out.startswith("ERROR: ") and said in out, out + err
    assert "no runner has ever ticked" not in out
    assert (root / "status.json").read_text() == content  # nothing changed


def _write_events(path: Path, events: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass", "runner"])
    proc.wait()
    return proc.pid


def test_report_of_a_killed_runner_runs_to_now_with_the_downtime(tmp_path: Path) -> None:
    """kill -9 while a job ran: the window runs to now, the lanes are down since the last heartbeat."""
    root = tmp_path / "root"
    root.mkdir()
    began = time.time() - 600
    _write_events(
        root / "events.jsonl",
        [
            {"ts": _ts(began), "job": "-", "event": "runner-start", "pid": 1, "last_alive": None},
            {"ts": _ts(began), "job": "a.job", "event": "start", "lane": "cpu", "attempt": 1},
            {"ts": _ts(began), "job": "-", "event": "lane", "lane": "gpu", "state": "idle"},
            {"ts": _ts(began), "job": "a.job", "event": "lane", "lane": "cpu", "state": "busy"},
        ],
    )
    status = {"runner": {"pid": _dead_pid(), "heartbeat": began + 8}, "running": [], "queued": []}
    (root / "status.json").write_text(json.dumps(status))
    for source in (str(root), str(root / "events.jsonl")):
        result = cli.invoke(app, ["report", source, "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        end = time.mktime(time.strptime(data["end"], "%Y-%m-%d %H:%M:%S"))
        assert abs(end - time.time()) < 5
        cpu, gpu = data["lanes"]["cpu"], data["lanes"]["gpu"]
        assert 7 <= cpu["busy_s"] <= 9 and abs(cpu["down_s"] - (time.time() - began - 8)) < 5
        assert abs(gpu["down_s"] - cpu["down_s"]) < 1 and 7 <= gpu["idle_s"] <= 9
        assert data["jobs"]["a.job"]["outcome"] == "unknown"
    text = cli.invoke(app, ["report", str(root)]).stdout
    assert "runner: not running; last sign of life" in text and "a.job" in text


def test_report_of_a_live_runner_runs_to_now(tmp_path: Path, stand_in: int) -> None:
    root = _live_root(tmp_path, stand_in)
    began = time.time() - 300
    _write_events(
        root / "events.jsonl",
        [
            {"ts": _ts(began), "job": "-", "event": "runner-start", "pid": 1},
            {"ts": _ts(began), "job": "a.job", "event": "start", "lane": "cpu", "attempt": 1},
            {"ts": _ts(began), "job": "a.job", "event": "lane", "lane": "cpu", "state": "busy"},
        ],
    )
    data = json.loads(cli.invoke(app, ["report", str(root), "--json"]).stdout)
    assert abs(data["lanes"]["cpu"]["busy_s"] - 300) < 5 and data["lanes"]["cpu"]["down_s"] == 0
    assert data["jobs"]["a.job"]["outcome"] == ""  # still running: unfinished, truly


def test_a_job_that_ended_while_the_runner_was_down_keeps_its_own_duration(tmp_path: Path) -> None:
    d = "2026-10-12 "
    path = tmp_path / "events.jsonl"
    _write_events(
        path,
        [
            {"ts": d + "01:00:00", "job": "-", "event": "runner-start", "pid": 1},
            {"ts": d + "01:00:00", "job": "a.job", "event": "start", "lane": "cpu", "attempt": 1},
            {"ts": d + "01:40:00", "job": "-", "event": "runner-start", "pid": 2, "last_alive": d + "01:00:05"},
            {
                "ts": d + "01:40:00",
                "job": "a.job",
                "event": "done",
                "rc": 0,
                "duration_s": 8.0,
                "ended": d + "01:00:08",
                "while_down": True,
            },
            {"ts": d + "01:40:01", "job": "b.job", "event": "start", "lane": "cpu", "attempt": 1},
            {"ts": d + "01:40:31", "job": "b.job", "event": "done", "rc": 0, "ended": d + "01:40:21"},
        ],
    )
    data = json.loads(cli.invoke(app, ["report", str(path), "--json"]).stdout)
    assert data["jobs"]["a.job"]["durations"] == [8.0] and data["jobs"]["a.job"]["outcome"] == "done"
    assert data["jobs"]["b.job"]["durations"] == [20.0]  # from `ended` where there is no duration_s


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_report_across_the_dst_fall_back_keeps_file_order(tmp_path: Path, new_york: None) -> None:
    """01:50 EDT start, done at 01:10 EST (20 minutes later): the runner writes naive local times."""
    d = "2026-11-01 "
    path = tmp_path / "events.jsonl"
    _write_events(
        path,
        [
            {"ts": d + "01:40:00", "job": "-", "event": "runner-start", "pid": 1},
            {"ts": d + "01:50:00", "job": "a.job", "event": "start", "lane": "cpu", "attempt": 1},
            {"ts": d + "01:50:00", "job": "a.job", "event": "lane", "lane": "cpu", "state": "busy"},
            {"ts": d + "01:10:00", "job": "a.job", "event": "done", "rc": 0},
            {"ts": d + "01:10:00", "job": "-", "event": "lane", "lane": "cpu", "state": "idle"},
            {"ts": d + "01:30:00", "job": "-", "event": "heartbeat"},
        ],
    )
    result = cli.invoke(app, ["report", str(path), "--json"])
    data = json.loads(result.stdout)
    assert data["jobs"]["a.job"] == {
        "attempts": 1,
        "retries": 0,
        "reruns": 0,
        "outcome": "done",
        "busy_s": 1200.0,
        "durations": [1200.0],
        "lane": "cpu",
    }
    assert data["lanes"]["cpu"]["busy_s"] == 1200 and data["lanes"]["cpu"]["idle_s"] == 1200
    text = cli.invoke(app, ["report", str(path)]).stdout
    assert text.startswith("report 2026-11-01 01:40:00 EDT .. 2026-11-01 01:30:00 EST (50m00s)")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "no events (it is empty)"),
        ("myhost\n", "not an events.jsonl: none of its 1 lines is an event record (line 1: not JSON)"),
        ('{"a": 1}\n', "line 1: no 'event' field"),
    ],
)
def test_report_of_a_file_that_is_no_events_file_is_an_error(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "runner.out"
    path.write_text(content)
    result = cli.invoke(app, ["report", str(path)])
    assert result.exit_code == 2 and said in result.output and "1970" not in result.output


def test_report_since_after_until_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write_events(path, [{"ts": "2026-10-12 01:00:00", "job": "-", "event": "runner-start"}])
    result = cli.invoke(app, ["report", str(path), "--since", "2026-10-12 02:00", "--until", "2026-10-12 01:00"])
    assert result.exit_code == 2 and "is not before --until" in result.output and "-3600" not in result.output


def test_report_since_after_the_window_s_end_is_an_error_not_a_negative_window(tmp_path: Path) -> None:
    """Without --until the window ends now (or at the last event): a --since after it was a report of '(-97044721s)'
    with exit 0."""
    path = tmp_path / "events.jsonl"
    _write_events(path, [{"ts": "2026-10-12 01:00:00", "job": "-", "event": "runner-start"}])
    result = cli.invoke(app, ["report", str(path), "--since", "2099-01-01 00:00"])
    assert result.exit_code == 2, result.output
    assert "--since 2099-01-01 00:00:00 is after" in result.output and "the window would be empty" in result.output
    assert "(-" not in result.output


def test_report_skips_and_counts_malformed_events(tmp_path: Path) -> None:
    d = "2026-10-12 "
    path = tmp_path / "events.jsonl"
    _write_events(
        path,
        [
            {"ts": d + "01:00:00", "job": "-", "event": "runner-start"},
            {"ts": d + "01:00:01", "job": ["x"], "event": "start", "lane": "cpu"},
            {"ts": 5, "job": "a.job", "event": "start"},
            {"ts": d + "01:00:02", "job": "a.job", "event": "failed", "tail": [5]},
            {"ts": d + "01:00:03", "job": "-", "event": "lane", "lane": ["cpu"], "state": "idle"},
            {"ts": d + "01:00:04", "job": "b.job", "event": "start", "lane": "cpu"},
            {"ts": d + "01:00:09", "job": "b.job", "event": "done", "rc": 0},
        ],
    )
    result = cli.invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert (
        "skipped 4 malformed events: line 2: 'job' is a list; line 3: 'ts' is an int; line 4: 'tail' holds"
        in result.stdout
    )
    assert "line 5: 'lane' is a list" in result.stdout
    data = json.loads(cli.invoke(app, ["report", str(path), "--json"]).stdout)
    assert list(data["jobs"]) == ["b.job"] and len(data["skipped"]) == 4


def test_html_report_escapes_a_hostile_lane_state(tmp_path: Path) -> None:
    path, page = tmp_path / "events.jsonl", tmp_path / "r.html"
    _write_events(
        path,
        [
            {
                "ts": "2026-12-02 10:00:00",
                "job": "-",
                "event": "lane",
                "lane": "cpu",
                "state": 'busy"><script>alert(1)</script>',
            },
            {"ts": "2026-12-02 10:00:05", "job": '"><img src=x onerror=alert(2)>', "event": "start", "lane": "cpu"},
            {
                "ts": "2026-12-02 10:00:05",
                "job": '"><img src=x onerror=alert(2)>',
                "event": "lane",
                "lane": "cpu",
                "state": "busy",
            },
            {"ts": "2026-12-02 10:00:10", "job": "-", "event": "lane", "lane": "cpu", "state": "idle"},
        ],
    )
    result = cli.invoke(app, ["report", str(path), "--html", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert "<script" not in html and "<img" not in html and "&quot;&gt;&lt;img" in html
    assert 'class="bar busy" data-state="busy"' in html
    assert "line 1: lane state" in result.stdout


def test_escape_sequences_from_a_job_never_reach_the_terminal(queue_root: Path, runner: RunnerProcess) -> None:
    runner.start()
    write_job(
        queue_root,
        "1-cpu-title.job",
        "printf 'progress \\033]0;PWNED-TITLE\\007 \\033[31mred\\033[0m "
        "\\033P1;2qdcs\\033\\\\ \\233Kc1 \\x07bell\\n'\nsleep 60\n",
    )
    runner.wait_event("start")
    wait_for(lambda: "PWNED" in json.dumps(runner.status().get("running")))
    result = cli.invoke(app, ["status", str(queue_root)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.stdout.splitlines() if "progress" in ln)
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\x9b" not in result.stdout
    assert "]0;" not in line and "PWNED-TITLE" not in line and "red" in line and "1;2q" not in line
    shown = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "status", "--root", str(queue_root)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    assert "progress" in shown.stdout and "\x1b" not in shown.stdout and "PWNED-TITLE" not in shown.stdout
    logs = cli.invoke(app, ["logs", str(queue_root), "1-cpu-title"])
    assert "progress" in logs.stdout and "\x1b" not in logs.stdout and "\x07" not in logs.stdout


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b]0;TITLE\x07b", "ab"),
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
        ("a\x1b[2J\x1b[Hb", "ab"),
        ("a\x1bPq#0\x1b\\b", "ab"),
        ("a\x1b(0b", "ab"),
        ("a\x9b31mb", "ab"),
        ("a\x9d0;T\x9cb", "ab"),
        ("a\x00b\x7fc\x85d", "a?b?c?d"),
        ("a\tb\r\nc\rd", "a b\nc\nd"),
        ("a\x1b", "a"),
    ],
)
def test_terminal_safe_removes_every_control_sequence(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown
    assert terminal_safe(raw, newlines=False) == shown.replace("\n", " ")


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "-1", "0", "86401"])
def test_an_unusable_timeout_is_a_usage_error(tmp_path: Path, value: str, stand_in: int) -> None:
    root = _live_root(tmp_path, stand_in)
    result = cli.invoke(app, ["status", str(root), "--timeout", value])
    assert result.exit_code == 2 and "give seconds above 0 and at most 86400" in result.output, result.output
    assert "unreachable" not in result.output and "internal error" not in result.output
    state = tmp_path / "w.json"
    watched = cli.invoke(app, ["watch", str(root), "--once", "--state", str(state), "--probe-timeout", value])
    assert watched.exit_code == 2 and "--probe-timeout" in watched.output and not state.exists()


@pytest.mark.parametrize("value", [".inf", ".nan", "-1", "0", "1e308"])
def test_an_unusable_hosts_file_timeout_is_located(tmp_path: Path, value: str) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  h:\n    root: {tmp_path}\n    ssh: nowhere\n    connect_timeout: {value}\n")
    result = cli.invoke(app, ["status", "h", "--hosts", str(hosts)])
    assert result.exit_code == 2 and f"{hosts}:5:" in result.output and "connect_timeout" in result.output
    assert "internal error" not in result.output


def test_incidents_are_keyed_by_the_queue_not_its_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opened as ./root from one directory, acked as an absolute path: the same incident."""
    root = tmp_path / "q" / "root"
    for state in STATES:
        (root / state).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "q")
    opened = cli.invoke(app, ["watch", "./root", "--once"])
    assert opened.exit_code == 14 and "no runner has ever ticked" in opened.stdout
    monkeypatch.chdir(tmp_path)
    acked = cli.invoke(app, ["ack", str(root), "DEAD"])
    assert acked.exit_code == 0 and f"acked DEAD:{root.resolve()} on" in acked.output, acked.output
    (tmp_path / "link").symlink_to(tmp_path / "q")
    again = cli.invoke(app, ["watch", "link/root", "--once"])
    assert again.exit_code == 0 and "DEAD" not in again.stdout  # acked, and the same queue through a link
    listed = cli.invoke(app, ["watch", "q/root/", "--incidents"])
    assert "open incidents as of the last probe" in listed.stdout and "acked until it changes" in listed.stdout


def _plan(tmp_path: Path, external: str | None = None) -> Path:
    path = tmp_path / "p.yaml"
    ext = f"external: [{json.dumps(external)}]\n" if external else ""
    path.write_text(f'plan: p\n{ext}jobs:\n  - name: a\n    run: "true"\n    outputs: [{tmp_path}/out/a]\n')
    return path


def test_a_refused_push_leaves_no_root_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))
    plan = _plan(tmp_path, external=str(tmp_path / "missing-gate"))
    root = tmp_path / "new" / "root"
    result = cli.invoke(app, ["push", str(root), str(plan)])
    assert result.exit_code == 1 and "does not exist" in result.output and "nothing was changed" in result.output
    assert not (tmp_path / "new").exists()  # neither the root, its parent, nor a .push.lock
    assert "1 job would be queued on" in result.output and "1 jobs" not in result.output.split("warning:")[1]
    # A root that was there keeps what it had; only what the push made is undone.
    kept = tmp_path / "kept"
    kept.mkdir()
    assert cli.invoke(app, ["push", str(kept), str(plan)]).exit_code == 1 and kept.is_dir()


def test_push_or_status_to_a_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    pushed = cli.invoke(app, ["push", str(afile), str(_plan(tmp_path))])
    assert pushed.exit_code == 1 and f"{afile} is not a directory" in pushed.output
    assert "Errno" not in pushed.output and "FileExistsError" not in pushed.output
    status = cli.invoke(app, ["status", str(afile)])
    assert status.exit_code == 1 and "is not a directory" in status.output and "does not exist" not in status.output
    under = cli.invoke(app, ["push", str(afile / "q"), str(_plan(tmp_path))])  # a root under a file
    assert under.exit_code == 1 and f"Not a directory ({afile / 'q'})" in under.output, under.output
    assert "Errno" not in under.output and "NotADirectoryError" not in under.output
    assert afile.read_text() == "mine\n"


def test_push_hints_quote_the_root_and_a_dry_run_queues_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "sp ace" / "my root ü"
    dry = cli.invoke(app, ["push", str(root), str(_plan(tmp_path)), "--dry-run"])
    assert dry.exit_code == 0 and "1 job would be queued on" in dry.output and not (tmp_path / "sp ace").exists()
    result = cli.invoke(app, ["push", str(root), str(_plan(tmp_path))])
    assert result.exit_code == 0 and "1 job queued on" in result.output
    hints = result.output.split("start one with ", 1)[1].split("`")[1::2]
    assert hints[0] == f"plan bootstrap '{root}' --start"
    hint = next(h for h in hints if "-m runner run" in h)
    assert hint == f"python3 -m runner run --root '{root}'"
    assert shlex.split(hint)[-1] == str(root)


def test_report_skips_an_event_whose_time_is_no_time(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write_events(
        path,
        [
            {"ts": "2026-10-12 01:00:00", "job": "-", "event": "runner-start"},
            {"ts": "2026-13-45 99:99:99", "job": "a.job", "event": "start"},
            {"ts": "0001-01-01 00:00:00", "job": "b.job", "event": "start"},
        ],
    )
    result = cli.invoke(app, ["report", str(path)])
    assert result.exit_code == 0 and "'2026-13-45 99:99:99': not a time" in result.output, result.output
    assert "a.job" not in result.output.split("jobs:")[1]
