"""The watcher says what is true now: bad data is a clear message (never a traceback), and nothing else changes."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from runner.queue import STATES

cli = CliRunner()


@pytest.fixture(autouse=True)
def _no_hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PLAN_HOSTS", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


def _ts(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@pytest.fixture
def stand_in() -> Iterator[int]:
    """A live process whose command line names the runner: what the agent checks a status.json pid against."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "runner"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _live_root(tmp_path: Path, pid: int) -> Path:
    """A queue root as a live runner leaves it: status.json with a fresh heartbeat and PID."""
    root = tmp_path / "root"
    for state in STATES:
        (root / state).mkdir(parents=True, exist_ok=True)
    now = time.time()
    status = {"runner": {"pid": pid, "heartbeat": now, "tick": 3, "version": "t", "root": str(root)},
              "running": [], "queued": [], "lanes": {"cpu": {"state": "idle", "since": now}},
              "lane_order": ["cpu"], "counts": {s: 0 for s in STATES}}
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
    _append(root, json.dumps({"ts": _ts(time.time()), "job": "z", "event": "failed", "tail": [5]}),
            json.dumps({"event": "done", "ts": _ts(time.time())}), "not json {")
    code, out, err = _watch(root, state)
    assert code == 0, out + err
    assert "internal error" not in out + err
    assert "skipped 3 malformed events" in err and "'tail' holds something that is not a string" in err
    assert "a 'done' event with no 'job'" in err and "not JSON" in err and "byte " in err
    offset = json.loads(state.read_text())["offset"]
    assert offset == (root / "events.jsonl").stat().st_size  # the offset moved past them
    # Said once; a good event after them still alerts.
    _append(root, json.dumps({"ts": _ts(time.time()), "job": "y.job", "event": "failed", "tail": ["boom"]}))
    code, out, err = _watch(root, state)
    assert code == 10 and "failed y.job" in out and "boom" in out and "skipped" not in err
    status = cli.invoke(app, ["status", str(root)])
    assert status.exit_code == 0 and "internal error" not in status.stdout
    assert "skipped 3 malformed events" in status.stdout


@pytest.mark.parametrize(("content", "said"), [
    ("[1]", "is corrupt: it is a list, not an object"),
    ('{"runner": 5, "running": "x"}', "is corrupt: 'runner' is an int, not an object"),
    ('{"runner": {"pid": 1}, "running": "x"}', "is corrupt: running is a string, not a list"),
    ('{"running": [{"job": "a.job", "lane": "cpu", "elapsed_s": "1"}]}', "running[0].elapsed_s is a string"),
    ("garbage", "exists but is not readable JSON"),
])
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
