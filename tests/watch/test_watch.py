"""`plan status` and `plan watch` against a real runner, locally and over a real loopback sshd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from runner.procs import GpuUser
from runner.progress import parse_progress
from tests.conftest import REPO, RunnerProcess, wait_for, write_job
from tests.sshd import Sshd
from tests.ticking import Ticking

cli = CliRunner()


def watch(host: str, state: Path, *args: str) -> tuple[int, str]:
    result = cli.invoke(app, ["watch", host, "--once", "--state", str(state), *args])
    return result.exit_code, result.stdout


pytestmark = pytest.mark.usefixtures("no_hosts")


@pytest.fixture
def ticked(ticking: Callable[..., Ticking], stand_in: int) -> Callable[[float], Ticking]:
    """`ticked(now)`: an in-process runner (tests/ticking.py) ticked once at NOW, that `plan watch` takes for a
    live one: its status.json names a stand-in process (conftest)."""
    return lambda now: ticking(now, pid=stand_in).tick(now)


def _fail(run: Ticking, job: str, line: str, now: float) -> None:
    """JOB starts, says LINE and exits 1, on the ticking runner RUN at NOW."""
    run.tick(now)
    run.say(job, line)
    run.procs.exit(job, 1)
    run.tick(now + 1)
    assert run.events("failed")


def test_failed_job_is_an_event_and_restart_does_not_realert(
    tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]
) -> None:
    state = tmp_path / "watch.json"
    now = time.time() - 10  # the runner's ticks, a little in the past: its heartbeat is fresh for the watcher
    run = ticked(now)
    assert watch(str(queue_root), state)[0] == 0  # first probe: remembers the offset
    write_job(queue_root, "5-cpu-bad.job", "echo 'unsupported sampler flag: -b'\nexit 1\n")
    _fail(run, "5-cpu-bad.job", "unsupported sampler flag: -b", now + 1)
    code, out = watch(str(queue_root), state)  # the box's incident, as its book has it
    assert code == 10 and out.startswith("EVENT: ") and "5-cpu-bad.job failed: exited 1" in out
    assert "unsupported sampler flag: -b" in out and out.rstrip().endswith(
        f"look: plan logs {queue_root} 5-cpu-bad.job)"
    )
    assert watch(str(queue_root), state)[0] == 0  # a restarted watcher does not replay it


def test_long_net_job_is_a_stall_and_empty_running_is_fine(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking], stand_in: int
) -> None:
    state = tmp_path / "watch.json"
    now = time.time() - 10
    run = ticking(now, pid=stand_in, warn_after={"net": 5.0}).tick(now)  # the box's threshold: net jobs 5 s
    code, out = watch(str(queue_root), state)
    assert code == 0, out  # nothing running, no net job: not an error (the seed's [ -f ] bug)
    write_job(queue_root, "92c-net-mai-code.job", "# LANE=net\nsleep 300\n")
    run.tick(now)  # it starts, 10 s ago
    run.say("92c-net-mai-code.job", " 64 52.44G  64 33.95G   0      0  2.72M      0 5:27:57 3:32:21 1:55:36  2.92M")
    run.tick(now + 10)  # still running, 10 s on (the time passed in: a loaded machine made it 11 s on the clock)
    code, out = watch(str(queue_root), state)
    assert code == 11 and out.startswith("STALL: ") and "92c-net-mai-code.job running 10s in lane net" in out
    assert "64% of 52.44G" in out
    status = cli.invoke(app, ["status", str(queue_root)])
    assert status.exit_code == 0
    assert "64% of 52.44G (33.95G) at 2.72M/s, ETA 1:55:36" in status.stdout


def test_idle_says_why_work_waits(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking], stand_in: int
) -> None:
    state = tmp_path / "watch.json"
    write_job(queue_root, "1-gpu-a.job", f"# LANE=gpu\n# REQUIRES=test -f {tmp_path}/never\necho a\n")
    now = time.time() - 10  # idle since then
    run = ticking(now, pid=stand_in, idle_s=5.0).tick(now - 10)
    assert run.status()["queued"]
    assert watch(str(queue_root), state)[0] == 0
    run.tick(now)
    code, out = watch(str(queue_root), state)
    assert (
        code == 12
        and "IDLE: " in out
        and "nothing running for 10s while 1 job wait (1-gpu-a.job; first: requires" in out
    )


def test_blocked_job(tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]) -> None:
    want = f"{tmp_path}/strata-qwen-q2_0.json"
    write_job(queue_root, "84c-gpu.job", f"# LANE=gpu\n# REQUIRES=test -f {want}\necho\n")
    (queue_root / "manifest.json").write_text(
        json.dumps({"jobs": {"84c-gpu.job": {"requires": [want]}}, "producers": {}, "external": []})
    )
    now = time.time()
    assert ticked(now).events("blocked")
    code, out = watch(str(queue_root), tmp_path / "w.json", "--idle", "3600")
    assert code == 13 and out.startswith(
        f"BLOCKED: {queue_root}: 1 job can never run: no job produces {want} (84c-gpu.job)"
    )


def test_lasting_alert_is_sent_once_until_realert(
    tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]
) -> None:
    write_job(queue_root, "84c-gpu.job", "# LANE=gpu\n# REQUIRES=test -f /nonexistent/x\necho\n")
    (queue_root / "manifest.json").write_text(
        json.dumps({"jobs": {"84c-gpu.job": {"requires": ["/nonexistent/x"]}}, "producers": {}, "external": []})
    )
    now = time.time()
    assert ticked(now).events("blocked")
    state, got = tmp_path / "w.json", tmp_path / "alerts"
    hook = f"cat >> {got}; echo >> {got}"
    for _ in range(3):
        watch(str(queue_root), state, "--on-alert", hook, "--idle", "3600", "--events", "none")
    assert len(got.read_text().splitlines()) == 1
    watch(str(queue_root), state, "--on-alert", hook, "--idle", "3600", "--events", "none", "--realert", "0")
    assert len(got.read_text().splitlines()) == 2


def test_killed_runner_is_dead(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    runner.start()
    state = tmp_path / "w.json"
    assert watch(str(queue_root), state, "--idle", "3600")[0] == 0
    runner.stop(signal.SIGKILL)
    code, out = watch(str(queue_root), state, "--idle", "3600")
    assert code == 14 and "DEAD: runner pid" in out and "is not running" in out


def test_missing_root_is_error_not_unreachable(tmp_path: Path) -> None:
    code, out = watch(str(tmp_path / "nope"), tmp_path / "w.json")
    assert code == 16 and out.startswith("ERROR: reached") and "does not exist" in out


def test_on_alert_gets_json_and_is_not_repeated(
    tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]
) -> None:
    now = time.time() - 10
    run = ticked(now)
    state = tmp_path / "w.json"
    got = tmp_path / "alerts"
    hook = f'cat >> {got}; echo " $PLAN_ALERT_KIND" >> {got}'
    assert watch(str(queue_root), state, "--on-alert", hook)[0] == 0
    write_job(queue_root, "5-cpu-bad.job", "exit 3\n")
    _fail(run, "5-cpu-bad.job", "", now + 1)
    codes = [watch(str(queue_root), state, "--on-alert", hook, "--idle", "3600")[0] for _ in range(2)]
    assert codes == [10, 0]
    lines = got.read_text().splitlines()
    assert len(lines) == 1
    payload, kind = lines[0].rsplit(" ", 1)
    assert kind == "EVENT" and json.loads(payload)["kind"] == "EVENT"


def test_over_ssh_event_and_unreachable_when_sshd_stops(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess, sshd: Sshd
) -> None:
    # The probes that must get through allow a loaded machine's sshd its time to answer (a 2 s connect timeout
    # failed them under load); the ones to the stopped sshd give up on it after 1 s.
    answers = sshd.hosts_file(queue_root, connect_timeout=30)
    hosts = sshd.hosts_file(queue_root, at=tmp_path / "stopped.yaml", connect_timeout=1, timeout=5)
    state = tmp_path / "w.json"
    runner.start()
    assert watch("testbox", state, "--hosts", str(answers), "--idle", "3600")[0] == 0
    write_job(queue_root, "5-cpu-bad.job", "exit 3\n")
    runner.wait_event("failed")
    code, out = watch("testbox", state, "--hosts", str(answers), "--idle", "3600")
    assert code == 10 and "EVENT: testbox: 5-cpu-bad.job failed: exited 3" in out
    os.kill(sshd.proc.pid, signal.SIGSTOP)
    try:
        for probe_number in range(1, 4):
            started = time.monotonic()
            code, out = watch("testbox", state, "--hosts", str(hosts), "--unreachable", "3", "--probe-timeout", "5")
            assert time.monotonic() - started < 9, "a probe must end within its bound"
            assert (code == 15) == (probe_number == 3), out
            if probe_number < 3:  # counted from the first, even with --once
                assert out.startswith(f"probe failed ({probe_number}/3): testbox"), out
        assert out.startswith("UNREACHABLE: 3 probes in a row failed")
    finally:
        os.kill(sshd.proc.pid, signal.SIGCONT)


def test_progress_parsers() -> None:
    curl = (
        " 64 52.44G  64 33.95G   0      0  2.72M      0 5:27:57 3:32:21 1:55:36  2.92M\r"
        " 64 52.44G  64 33.95G   0      0  2.72M      0 5:27:57 3:32:22 1:55:35  2.95M"
    )
    assert parse_progress(curl) == "64% of 52.44G (33.95G) at 2.72M/s, ETA 1:55:35"
    assert (
        parse_progress("x.gguf:  64%|######4   | 33.9G/52.4G [3:32:21<1:55:36, 2.72MB/s]")
        == "64% of 52.4G (33.9G) at 2.72MB/s, ETA 1:55:36"
    )
    assert (
        parse_progress("x.gguf   64%[=====>     ]  33.95G  2.72MB/s    eta 1h 55m")
        == "64% (33.95G) at 2.72MB/s, ETA 1h 55m"
    )
    assert parse_progress("PROGRESS: 3/4 MB\nother line") == "75% (3/4 MB)"
    assert parse_progress("no progress here") is None


def test_truncated_events_file_is_read_from_its_start(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    state = tmp_path / "w.json"
    runner.start()
    write_job(queue_root, "1-cpu-ok.job", "echo ok\n")
    runner.wait_event("done")
    assert watch(str(queue_root), state, "--idle", "3600")[0] == 0
    runner.stop()
    (queue_root / "events.jsonl").write_text("")  # rotated away by the owner
    runner._skip = 0
    runner.start()
    write_job(queue_root, "2-cpu-bad.job", "exit 4\n")
    runner.wait_event("failed")
    code, out = watch(str(queue_root), state, "--idle", "3600")
    assert code == 10 and "2-cpu-bad.job failed: exited 4" in out


def test_an_empty_queue_is_done_not_idle(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking], stand_in: int
) -> None:
    now = time.time()
    run = ticking(now, pid=stand_in, idle_s=0.2).tick(now)
    state = tmp_path / "w.json"
    assert watch(str(queue_root), state)[0] == 0
    for step in range(1, 6):
        run.tick(now + step * 0.2)  # a second of ticks, idle past the runner's idle threshold
    assert watch(str(queue_root), state) == (0, "")
    assert json.loads((queue_root / "incidents.json").read_text())["open"] == []


def test_fresh_once_watcher_sees_a_standing_gpu_foreign_hold(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking], stand_in: int
) -> None:
    """The box's incident opened long before this watcher first looked (time passed in; a real GPU user found
    by name is the runner's tests' own: tests/runner/test_gpu_lane.py)."""
    q, fresh = str(queue_root), tmp_path / "fresh.json"
    write_job(queue_root, "70-gpu-bench.job", "# LANE=gpu\necho bench\n")
    now = time.time() - 10
    run = ticking(now, pid=stand_in)
    run.procs.gpu = [GpuUser(4242, 1, "/opt/bin/gpuuser-77 300", "name")]
    run.tick(now).tick(now + 5)
    assert run.reason("70-gpu-bench.job")["reason"] == "gpu-foreign"  # type: ignore[index]
    code, out = watch(q, fresh)
    assert code == 18, out
    assert out.startswith(f"WAITING: {q}: gpu lane held by pid 4242 (gpuuser-77)"), out
    assert "1 job wait (70-gpu-bench.job)" in out
    assert watch(q, fresh) == (0, "")  # sent once
    run.procs.gpu = []  # the GPU user ends; the job runs and ends
    run.tick(now + 6)
    run.procs.exit("70-gpu-bench.job", 0)
    run.tick(now + 7)
    assert run.events("done")
    code, out = watch(q, fresh)
    assert code == 0 and out.startswith("RECOVERED: WAITING gpu-held:pid 4242 recovered after "), out


def test_dead_recovered_and_dead_again_under_on_alert(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    q, state, got = str(queue_root), tmp_path / "w.json", tmp_path / "alerts"
    args = ("--on-alert", f'echo "$PLAN_ALERT_KIND $(cat)" >> {got}', "--realert", "3600", "--idle", "3600")
    runner.start()
    wait_for(lambda: runner.status()["runner"]["pid"] == runner.proc.pid)
    assert watch(q, state, *args) == (0, "")
    runner.stop(signal.SIGKILL)
    code, out = watch(q, state, *args)
    assert code == 14 and out.startswith("DEAD: runner pid"), out
    assert watch(q, state, *args) == (0, "")  # still the same incident: not sent again within --realert
    runner.start()
    wait_for(lambda: runner.status()["runner"]["pid"] == runner.proc.pid)
    code, out = watch(q, state, *args)
    assert code == 0 and out.startswith(f"RECOVERED: DEAD {q} recovered after "), out
    runner.stop(signal.SIGKILL)  # killed again well within --realert: a new incident, sent at once
    code, out = watch(q, state, *args)
    assert code == 14 and out.startswith("DEAD: runner pid"), out
    lines = got.read_text().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["DEAD", "RECOVERED", "DEAD"]
    recovered = json.loads(lines[1].split(" ", 1)[1])
    assert recovered["kind"] == "RECOVERED" and recovered["recovered"] == "DEAD" and recovered["subject"] == q
    assert recovered["lasted_s"] > 0


def test_misspelt_words_are_refused_and_nothing_is_probed(tmp_path: Path, queue_root: Path) -> None:
    state = tmp_path / "w.json"  # no runner: a probe would find none (DEAD), not a usage error
    for flags, message in (
        (["--events", "faild"], "--events: unknown event 'faild'; did you mean 'failed'?"),
        (["--wake-on", "dnoe"], "--wake-on: unknown event 'dnoe'; did you mean 'done'?"),
        (["--waiting", "gpu-foriegn=10m"], "did you mean 'gpu-foreign'?"),
        (["--heartbeat-every", "daily"], "--heartbeat-every: not a duration: 'daily'"),
    ):
        result = cli.invoke(app, ["watch", str(queue_root), "--once", "--state", str(state), *flags])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output
    assert not state.exists()
    page = cli.invoke(app, ["watch", "--help"], terminal_width=200).output
    assert "--events EVENT,..." in page and "--wake-on EVENT" in page and "--waiting [REASON=]DURATION" in page
    assert "correlated-failure" in page and "gpu-foreign" in page and "<list" not in page


def test_ack_silences_one_incident_until_its_time_passes(
    tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]
) -> None:
    write_job(queue_root, "84c-gpu.job", "# LANE=gpu\n# REQUIRES=test -f /nonexistent/x\necho\n")
    (queue_root / "manifest.json").write_text(
        json.dumps({"jobs": {"84c-gpu.job": {"requires": ["/nonexistent/x"]}}, "producers": {}, "external": []})
    )
    now = time.time()
    run = ticked(now)
    assert run.events("blocked")
    q, state = str(queue_root), tmp_path / "w.json"
    args = ("--events", "none", "--realert", "0")
    assert watch(q, state, *args)[0] == 13
    assert watch(q, state, *args)[0] == 13  # --realert 0: sent on every probe

    def ack(*words: str) -> tuple[int, str]:
        result = cli.invoke(app, ["ack", q, *words, "--state", str(state)])
        return result.exit_code, result.output

    assert ack("BLOKED") == (
        2,
        "plan: unknown incident kind 'BLOKED'; did you mean 'BLOCKED'? (kinds: STALL, IDLE, "
        "BLOCKED, DEAD, STOPPED, UNREACHABLE, ERROR, PARKED, WAITING, SKEW; the box's causes: blocked, disk-full, "
        "failed, gpu-held, gpu-stalled, idle, install-stuck, long-running, parked, requires, or EVENT for every "
        "failure)\n",
    )
    code, out = ack("faild")  # a cause the box judges, misspelt: the box's kinds are named and suggested too
    assert code == 2 and "did you mean 'failed'?" in out, out
    code, out = ack("DEAD")  # judged by the watcher: acked in its own state file
    assert code == 1 and "no open incident DEAD (open: BLOCKED:blocked:/nonexistent/x)" in out
    code, out = ack("BLOCKED:84c-gpu", "--for", "1s", "--wait", "0")  # the box's: acked on the box
    assert code == 0 and out.startswith("acked blocked:/nonexistent/x on ") and "for 1s" in out
    assert "the runner has not taken the ack yet" in out
    run.tick(time.time())  # the runner takes it
    assert watch(q, state, *args) == (0, "")
    listing = cli.invoke(app, ["watch", q, "--incidents", "--state", str(state)]).output
    assert "open incidents as of the last probe" in listing and "BLOCKED     blocked:/nonexistent/x  open " in listing
    assert "acked until it changes" in listing
    until = json.loads((queue_root / "incidents.json").read_text())["open"][0]["acked"]["until"]
    run.tick(until + 1)  # the ack's time is over (passed in): the box says it again, and so does the watcher
    code, out = watch(q, state, *args)
    assert code == 13 and out.startswith(f"BLOCKED: {q}: 1 job can never run"), out


def test_heartbeat_every_sends_one_all_clear(
    tmp_path: Path, queue_root: Path, ticked: Callable[[float], Ticking]
) -> None:
    now = time.time()
    ticked(now)
    q, state, got = str(queue_root), tmp_path / "w.json", tmp_path / "alerts"
    code, out = watch(q, state, "--heartbeat-every", "6h", "--idle", "3600")
    assert code == 0 and out == f"OK: {q}: net idle, gpu idle, cpu idle; open incidents: 0\n"
    assert watch(q, state, "--heartbeat-every", "6h", "--idle", "3600") == (0, "")  # not due for 6 hours
    hook = f'echo "$PLAN_ALERT_KIND $(cat)" >> {got}'
    assert watch(q, tmp_path / "w2.json", "--heartbeat-every", "6h", "--on-alert", hook, "--idle", "3600")[0] == 0
    kind, payload = got.read_text().split(" ", 1)
    assert kind == "OK" and json.loads(payload)["open"] == 0


def test_a_running_watcher_sends_the_second_outage_too(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    """The issue's scenario: one long-lived `--on-alert` watcher, kill -9, restart, kill -9 again 45 s later."""
    got = tmp_path / "alerts"
    runner.start()
    wait_for(lambda: runner.status()["runner"]["pid"] == runner.proc.pid)
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plancompiler.cli",
            "watch",
            str(queue_root),
            "--state",
            str(tmp_path / "w.json"),
            "--interval",
            "0.3",
            "--realert",
            "600",
            "--idle",
            "3600",
            "--on-alert",
            f'echo "$PLAN_ALERT_KIND" >> {got}',
        ],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        kinds = lambda: got.read_text().split() if got.exists() else []  # noqa: E731
        for round_ in range(2):
            runner.stop(signal.SIGKILL)
            wait_for(lambda r=round_: kinds().count("DEAD") == r + 1, 15)
            runner.start()
            wait_for(lambda: runner.status()["runner"]["pid"] == runner.proc.pid)
            wait_for(lambda r=round_: kinds().count("RECOVERED") == r + 1, 15)
        assert kinds() == ["DEAD", "RECOVERED", "DEAD", "RECOVERED"]
    finally:
        watcher.terminate()
        out, _ = watcher.communicate(timeout=15)
    lines = out.decode().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["DEAD", "RECOVERED", "DEAD", "RECOVERED"], lines


def test_a_state_or_metrics_file_that_is_a_device_or_fifo_is_refused_and_left_as_it_is(
    tmp_path: Path, queue_root: Path
) -> None:
    """Both are rewritten by renaming a new file onto their name: `--state /dev/null` replaced this machine's
    /dev/null with a regular file. A clone of it (or, where no device can be made, a FIFO) stands in."""
    for kind, path in (("fifo", tmp_path / "fifo"), ("device", tmp_path / "null")):
        if kind == "fifo":
            os.mkfifo(path)
        elif subprocess.run(["mknod", "-m", "666", str(path), "c", "1", "3"], capture_output=True).returncode:
            continue  # not root: the FIFO has said it
        before = os.lstat(path)
        result = cli.invoke(app, ["watch", str(queue_root), "--once", "--state", str(path)])
        assert (result.exit_code, result.stderr) == (
            2,
            f"plan: --state {path}: not a regular file (it is rewritten whole, replacing it)\n",
        ), result.output
        metrics = subprocess.run(
            [sys.executable, "-S", "-m", "runner", "run", "--root", str(queue_root), "--metrics", str(path)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            timeout=30,
        )
        assert metrics.returncode == 2 and f"--metrics: {path}: not a regular file" in metrics.stderr, metrics.stderr
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
