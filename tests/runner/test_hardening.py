"""Runner hardening (issue 14): each chaos finding reproduced with a real runner process, then held."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from runner import procs, wrapper
from runner.config import Config
from runner.service.runner import Runner
from tests.conftest import REPO, RunnerProcess, kill_quietly, pid_alive, read_events, wait_for, write_job
from tests.fullfs import fill, small_tmpfs
from tests.ticking import FakeProcesses, Ticking

T0 = 1_000_000.0


def test_fifo_dir_socket_and_symlinks_never_wedge_or_run(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    q = queue_root / "queue"
    os.mkfifo(q / "10-fifo.job")
    (q / "11-dir.job").mkdir()
    os.symlink(tmp_path / "nowhere", q / "12-dangling.job")
    os.symlink("/etc/passwd", q / "13-passwd.job")
    sock = socket.socket(socket.AF_UNIX)
    # bound where the path is short (AF_UNIX: 107 bytes at most, which a deep tmp_path can pass), on the same
    # file system as tmp_path, then moved into the queue as any file is
    bound = Path(tempfile.mkdtemp()) / "s"
    sock.bind(str(bound))
    os.rename(bound, q / "14-sock.job")
    bound.parent.rmdir()
    (queue_root / "jobs").mkdir()
    (queue_root / "jobs/inside.sh").write_text(f"touch {tmp_path}/inside-ran\n")
    os.symlink(queue_root / "jobs/inside.sh", q / "15-inside.job")
    # failed/ already holds a non-empty directory of that name: this one cannot be moved, so it stays.
    (q / "16-stuck.job").mkdir()
    (queue_root / "failed/16-stuck.job").mkdir()
    (queue_root / "failed/16-stuck.job/x").touch()
    write_job(queue_root, "20-cpu-ok.job", f"touch {tmp_path}/ok-ran\n")
    runner.start()
    runner.wait_event("done", job="20-cpu-ok.job")
    invalid = {e["job"]: e["reason"] for e in runner.events("invalid")}
    assert "FIFO" in invalid["10-fifo.job"] and "directory" in invalid["11-dir.job"]
    # A symlink is never followed, wherever it points: inside the root, to /etc/passwd or nowhere.
    for name, target in (
        ("12-dangling.job", "nowhere"),
        ("13-passwd.job", "/etc/passwd"),
        ("15-inside.job", "inside.sh"),
    ):
        assert "a symlink (to " in invalid[name] and target in invalid[name], invalid[name]
    assert not (tmp_path / "inside-ran").exists()
    assert "socket" in invalid["14-sock.job"]
    assert "cannot move it to failed/" in invalid["16-stuck.job"]
    for name in ("10-fifo.job", "11-dir.job", "12-dangling.job", "13-passwd.job", "14-sock.job", "15-inside.job"):
        assert os.path.lexists(queue_root / "failed" / name) and not os.path.lexists(q / name)
    stuck = wait_for(lambda: next((x for x in runner.status()["queued"] if x["job"] == "16-stuck.job"), None))
    assert stuck["reason"] == "blocked" and "directory" in stuck["detail"]
    ticks = runner.status()["runner"]["tick"]
    wait_for(lambda: runner.status()["runner"]["tick"] > ticks + 3)
    assert [e["job"] for e in runner.events("invalid")].count("16-stuck.job") == 1, "said once, not every tick"
    started = {e["job"] for e in runner.events("start")}
    assert started == {"20-cpu-ok.job"}
    assert runner.stop() == 0, "SIGTERM must stop it (one that hangs is killed after 15 s: rc -9)"
    sock.close()


def test_a_file_written_in_place_is_never_read_half_written(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start("--settle", "0.5")
    texts = {}
    for i in range(10):
        target = tmp_path / "made" / f"dir-{i}" / "deep"
        texts[f"{i:02d}-cpu-slow.job"] = (
            f"# LANE=cpu\n# first a comment that takes a while to arrive\n"
            f"mkdir -p {target}\necho whole > {target}/marker\n"
        )

    def writer() -> None:  # 16-byte chunks, in place, as the seed's scp and hand edits did
        for name, text in texts.items():
            with open(queue_root / "queue" / name, "w") as handle:
                for at in range(0, len(text), 16):
                    handle.write(text[at : at + 16])
                    handle.flush()
                    time.sleep(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    wait_for(lambda: any(q["reason"] == "settling" for q in runner.status()["queued"]), 5, 0.02)
    thread.join()
    wait_for(lambda: len(runner.events("done")) == 10, 20)
    assert not runner.events("invalid") and not os.listdir(queue_root / "failed")
    for i in range(10):
        assert (tmp_path / "made" / f"dir-{i}" / "deep" / "marker").read_text() == "whole\n"
    assert not (tmp_path / "-").exists() and not Path("-").exists()


def test_a_settling_file_is_taken_when_it_settles_not_at_the_next_tick(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start("--tick", "60", "--settle", "0.3")  # returns past its first tick (its first status.json)
    write_job(queue_root, "1-cpu-a.job", f"touch {tmp_path}/ran\n")
    runner.wait_event("done", job="1-cpu-a.job", timeout=10)  # a 60 s tick would fail this


def test_pushed_file_listed_with_its_hash_needs_no_wait(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    import hashlib

    text = f"# LANE=cpu\ntouch {tmp_path}/ran\n"
    (queue_root / "manifest.json").write_text(
        json.dumps(
            {
                "plan": "t",
                "jobs": {
                    "1-cpu-pushed.job": {
                        "requires": [],
                        "outputs": [],
                        "sha": hashlib.sha256(text.encode()).hexdigest(),
                    }
                },
                "producers": {},
                "external": [],
            }
        )
    )
    runner.start("--settle", "1h")
    write_job(queue_root, "1-cpu-pushed.job", text)
    write_job(queue_root, "2-cpu-by-hand.job", f"touch {tmp_path}/ran2\n")
    runner.wait_event("done", job="1-cpu-pushed.job", timeout=5)
    waiting = wait_for(lambda: next((q for q in runner.status()["queued"] if q["job"] == "2-cpu-by-hand.job"), None))
    assert waiting["reason"] == "settling"
    assert not (tmp_path / "ran2").exists()


def test_wrong_types_in_every_state_file_are_reported_not_fatal(queue_root: Path, tmp_path: Path) -> None:
    (queue_root / "manifest.json").write_text(json.dumps({"jobs": [], "producers": [1], "external": "x"}))
    (queue_root / "state.json").write_text(json.dumps({"attempts": {"b.job": None}, "backoff_until": "soon"}))
    (queue_root / "parked.json").write_text("[1, 2]")
    (queue_root / "control").mkdir(exist_ok=True)
    (queue_root / "control/retry-x.job").write_text("[1]")
    (queue_root / "control/cancel-..").write_text("{}")
    os.mkfifo(queue_root / "control/retry-fifo.job")
    write_job(queue_root, "1-cpu-a.job", f"touch {tmp_path}/a\n")
    for _ in range(2):  # the second life reads the same files: no crash loop
        runner = RunnerProcess(queue_root).start()
        try:
            wait_for(lambda r=runner: r.status()["runner"]["tick"] >= 3)
            assert runner.proc.poll() is None  # type: ignore[union-attr]
            assert runner.status()["parked"]
        finally:
            runner.stop()
    corrupt = {(e["file"], e["field"]) for e in read_events(queue_root) if e["event"] == "state-corrupt"}
    assert {
        ("manifest.json", "jobs"),
        ("manifest.json", "producers"),
        ("manifest.json", "external"),
        ("state.json", "attempts.b.job"),
        ("state.json", "backoff_until"),
        ("parked.json", "(whole file)"),
        ("control/retry-x.job", "(whole file)"),
        ("control/cancel-..", "(name)"),
        ("control/retry-fifo.job", "(whole file)"),
    } <= corrupt
    assert not os.listdir(queue_root / "control"), "bad requests are removed, once"
    assert not (tmp_path / "a").exists(), "parked.json of the wrong shape still parks"
    (queue_root / "parked.json").unlink()
    runner = RunnerProcess(queue_root).start()
    try:
        runner.wait_event("done", job="1-cpu-a.job")
    finally:
        runner.stop()


def test_disk_full_requeues_refunds_and_drains_when_space_returns(tmp_path: Path) -> None:
    """A real ENOSPC: the queue root is a 1 MiB tmpfs, filled up; jobs gated on a file outside it."""
    root = tmp_path / "q"
    gate = tmp_path / "gate"
    runner = RunnerProcess(root)
    with small_tmpfs(root, "1m"), runner:
        for i in range(3):
            write_job(root, f"{i}-cpu-j.job", f"# REQUIRES=test -f {gate}\necho hello {i}\n")
        metrics = tmp_path / "runner.prom"  # off the full disk: what the runner did meanwhile shows there
        runner.start("--metrics", str(metrics))
        wait_for(lambda: len(runner.status()["queued"]) == 3)
        filler = fill(root)
        gate.touch()

        def tried() -> int | None:
            text = metrics.read_text() if metrics.exists() else ""  # written from the runner's first tick on
            if 'plan_events_total{event="start-failed"}' not in text:
                return None
            return int(float(re.search(r"^plan_runner_ticks_total (\S+)$", text, re.M).group(1)))  # type: ignore[union-attr]

        ticked = wait_for(tried)  # a start the full disk refused
        wait_for(lambda: (tried() or 0) >= int(ticked) + 3)  # and several ticks with the disk full after it
        assert runner.proc.poll() is None, "the runner keeps running on a full disk"  # type: ignore[union-attr]
        assert sorted(os.listdir(root / "queue")) == ["0-cpu-j.job", "1-cpu-j.job", "2-cpu-j.job"]
        assert not [n for n in os.listdir(root / "running") if not n.startswith(".")]
        filler.unlink()
        wait_for(lambda: len(runner.events("done")) == 3, 15)
        failed = runner.events("start-failed")
        assert failed and failed[0]["errno"] == "ENOSPC" and failed[0]["job"] == "0-cpu-j.job"
        writes = {e["file"] for e in runner.events("state-corrupt") if e["field"] == "(write)"}
        assert "status.json" in writes or "state.json" in writes
        assert json.loads((root / "state.json").read_text())["attempts"] == {f"{i}-cpu-j.job": 1 for i in range(3)}
        for line in (root / "events.jsonl").read_text().splitlines():
            json.loads(line)  # no line torn by the full disk


def test_disk_full_reason_in_status_while_it_lasts(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    """Only logs/ full (its own small tmpfs): status.json can still say disk-full."""
    with small_tmpfs(queue_root / "logs", "256k"), runner:
        filler = fill(queue_root / "logs")
        write_job(queue_root, "1-gpu-a.job", "echo a\n")
        runner.start()
        status = wait_for(lambda: (s := runner.status())["disk_full"] and s)
        assert "ENOSPC" in status["disk_full"]
        assert status["queued"][0]["reason"] == "disk-full"
        shown = subprocess.run(
            [sys.executable, "-S", "-m", "runner", "status", "--root", str(queue_root)],
            text=True,
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        ).stdout
        assert "DISK FULL: 1-gpu-a.job could not start: ENOSPC" in shown
        assert len(runner.events("start-failed")) == 1
        filler.unlink()
        runner.wait_event("done", job="1-gpu-a.job")
        wait_for(lambda: runner.status()["disk_full"] is None)


def test_job_that_ends_while_the_runner_is_down_is_recorded_not_rerun(tmp_path: Path, queue_root: Path) -> None:
    runs = tmp_path / "runs"
    gate = tmp_path / "gate"
    write_job(queue_root, "1-cpu-ok.job", f"echo run >> {runs}\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n")
    write_job(
        queue_root,
        "2-gpu-bad.job",
        f"# LANE=gpu\n# RETRIES=1\necho run >> {runs}.bad\n"
        f"while [ ! -e {gate} ]; do sleep 0.05; done\necho 'model file truncated'\nexit 4\n",
    )
    first = RunnerProcess(queue_root).start()
    first.wait_event("start", job="1-cpu-ok.job")
    first.wait_event("start", job="2-gpu-bad.job")
    first.stop(signal.SIGKILL)
    gate.touch()
    wait_for(
        lambda: (
            (queue_root / "running/.1-cpu-ok.job.exit").exists()
            and (queue_root / "running/.2-gpu-bad.job.exit").exists()
        )
    )
    second = RunnerProcess(queue_root).start()
    try:
        done = second.wait_event("done", job="1-cpu-ok.job")
        failed = second.wait_event("failed", job="2-gpu-bad.job")
        assert done["while_down"] is True and failed["rc"] == 4 and failed["attempt"] == 1
        assert "model file truncated" in failed["tail"]
        assert runs.read_text() == "run\n" and Path(f"{runs}.bad").read_text() == "run\n"
        assert not second.events("recovered")
        assert sorted(os.listdir(queue_root / "running")) == []
    finally:
        second.stop()


def test_a_wrapper_caught_between_its_jobs_end_and_its_record_is_let_write_it(tmp_path: Path, queue_root: Path) -> None:
    """The chaos bench's rare re-run of a finished job (a loaded machine widens the window): a new runner life
    finds a wrapper whose job has ended by itself but which has not yet written its record. A TERM would make it
    write none, and the finished job would run again: it is given FINISHING_GRACE_S to finish, while the leftovers
    of a job still running are ended. (In-process: which moment a real runner's scan falls on is not ours.)"""
    job, gate = tmp_path / "job", tmp_path / "gate"
    job.write_text(f"until [ -e {gate} ]; do sleep 0.02; done\n")
    real = subprocess.Popen(wrapper.argv(str(job), tmp_path / "record", None))  # a real one: its command line
    try:
        wait_for(lambda: "plan-job" in procs.read_cmdline(real.pid))
        cmdline = procs.read_cmdline(real.pid)
        assert wrapper.is_wrapper(cmdline) and not wrapper.is_wrapper("bash -c sleep 1")
    finally:
        gate.touch()
        real.wait()

    class Leftovers(FakeProcesses):
        """Three leftovers: a wrapper whose job has ended (it exits at the second look), and a wrapper with
        its job still running."""

        looks = 0
        ended_pids: list[int] = []

        def end(self, pids: Iterable[int]) -> None:
            self.ended_pids.extend(pids)

        def leftovers(self, tag_prefix: str) -> list[procs.Proc]:
            return [
                procs.Proc(101, 1, 101, "S", "bash", cmdline, "t:1-cpu-done.job"),
                procs.Proc(201, 1, 201, "S", "bash", cmdline, "t:2-cpu-running.job"),
                procs.Proc(202, 201, 201, "S", "bash", "bash 2-cpu-running.job", "t:2-cpu-running.job"),
            ]

        def alive(self, pid: int) -> bool:
            self.looks += pid == 101
            return pid != 101 or self.looks < 2

    fake = Leftovers()
    runner = Runner(Config(root=queue_root, settle_s=0.0, kill_grace_s=5.0), processes=fake)
    try:
        runner.start(1_000_000.0)
    finally:
        runner.queue.close()
        runner.release_lock()
    assert fake.ended_pids == [201, 202] and fake.looks == 2  # the finishing wrapper: looked at, never ended
    [killed] = [e for e in read_events(queue_root) if e["event"] == "orphans-killed"]
    assert killed["pids"] == [201, 202]


@pytest.mark.parametrize("finishes_in", [0.3, None])
def test_a_finishing_wrapper_gets_more_than_the_kill_grace_and_is_ended_only_past_its_own(
    queue_root: Path, monkeypatch: pytest.MonkeyPatch, finishes_in: float | None
) -> None:
    """A loaded box may not schedule a finishing wrapper within the kill grace (1 s in the suite's runners,
    where the chaos test once saw a finished job run again): it gets FINISHING_GRACE_S. One that never finishes
    (a stalled box) is ended once that has passed, as a leftover of the earlier life."""
    from runner.service import runner as service

    monkeypatch.setattr(service, "FINISHING_GRACE_S", 1.0)
    until = time.monotonic() + (finishes_in or 3600)
    cmdline = "bash -c " + wrapper.SCRIPT + " plan-job 1-cpu-done.job"

    class Slow(FakeProcesses):
        ended_pids: list[int] = []

        def end(self, pids: Iterable[int]) -> None:
            self.ended_pids.extend(pids)

        def leftovers(self, tag_prefix: str) -> list[procs.Proc]:
            return [procs.Proc(101, 1, 101, "S", "bash", cmdline, "t:1-cpu-done.job")]

        def alive(self, pid: int) -> bool:
            return time.monotonic() < until

    fake = Slow()
    runner = Runner(Config(root=queue_root, settle_s=0.0, kill_grace_s=0.05), processes=fake)
    began = time.monotonic()
    try:
        runner.start(1_000_000.0)
    finally:
        runner.queue.close()
        runner.release_lock()
    killed = [e for e in read_events(queue_root) if e["event"] == "orphans-killed"]
    if finishes_in:
        assert fake.ended_pids == [] and not killed  # waited 0.3 s, six times the kill grace
    else:
        assert fake.ended_pids == [101] and killed[0]["pids"] == [101]
        assert time.monotonic() - began >= 1.0


def test_the_wrappers_exit_record_is_one_write_taken_only_whole(tmp_path: Path) -> None:
    """The wrapper writes its record straight to its name (no temp file, no mv to fork): the job's status and
    both times, ending in a newline. A record cut short (a disk full, a machine crash) is no record."""
    from runner import wrapper

    job, record = tmp_path / "1-cpu-x.job", tmp_path / ".1-cpu-x.job.exit"
    job.write_text("echo hi\nexit 3\n")
    before = time.time()
    done = subprocess.run(wrapper.argv(str(job), record, None), capture_output=True, text=True, timeout=30)
    assert done.returncode == 3 and done.stdout == "hi\n"
    assert sorted(os.listdir(tmp_path)) == [".1-cpu-x.job.exit", "1-cpu-x.job"]  # nothing left beside it
    text = record.read_text()
    got = wrapper.read_record(record)
    assert text.endswith("\n") and got is not None and got.rc == 3
    assert before - 1 <= got.started <= got.ended <= time.time() + 1
    for cut in ("", text[:1], text[: text.index(" ") + 1], text[:-1]):
        record.write_text(cut)
        assert wrapper.read_record(record) is None, cut


@pytest.mark.parametrize("root", ["q", "qlink"])
def test_relative_and_symlinked_root_runs_jobs(tmp_path: Path, root: str) -> None:
    (tmp_path / "q/queue").mkdir(parents=True)
    (tmp_path / "qlink").symlink_to("q")
    (tmp_path / "q/queue/1-cpu-a.job").write_text("mkdir -p /tmp && echo ok\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "runner", "run", "--root", root, "--tick", "0.2", "--settle", "0"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                '"event": "done"' in (tmp_path / "q/events.jsonl").read_text()
                if (tmp_path / "q/events.jsonl").exists()
                else False
            )
        )
        done = [e for e in read_events(tmp_path / "q") if e["event"] == "done"]
        assert done[0]["rc"] == 0 and "ok" in (tmp_path / "q/logs/1-cpu-a.job.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_torn_last_line_of_events_is_mended_before_the_first_append(queue_root: Path) -> None:
    events = queue_root / "events.jsonl"
    events.write_text('{"ts": "2026-01-01 00:00:00", "job": "-", "event": "do')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(queue_root), "--tick", "0.2"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        lines = wait_for(lambda: len(events.read_text().splitlines()) >= 2 and events.read_text().splitlines())
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert lines[0].endswith('"event": "do')
    assert json.loads(lines[1])["event"] == "runner-start"


def _fake_server(tmp_path: Path) -> Path:
    """A GPU user by a name of this test's own (the runner is told it with --gpu-names): a name every runner
    knows, such as llama-server, would hold the gpu lane of every other runner on the machine meanwhile."""
    exe = tmp_path / "bin" / f"gpuuser-{os.getpid() % 100000}"
    exe.parent.mkdir(exist_ok=True)
    shutil.copy("/bin/sleep", exe)
    return exe


def test_server_that_escapes_tag_and_session_ends_with_its_job(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    server = _fake_server(tmp_path)
    write_job(
        queue_root,
        "65-gpu-intake.job",
        f"# LANE=gpu\nenv -i setsid {server} 302 >/dev/null 2>&1 </dev/null &\necho $! > {tmp_path}/pid\nsleep 0.2\n",
    )
    write_job(queue_root, "66-gpu-bench.job", "# LANE=gpu\necho bench\n")
    runner.start("--gpu-names", server.name)
    pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip()))
    try:
        killed = runner.wait_event("orphans-killed", job="65-gpu-intake.job")
        assert killed["pids"] == [pid] and "302" in killed["cmds"][0]
        assert killed["why"] == "escaped its job's tag and session"
        wait_for(lambda: not pid_alive(pid), 15)
        runner.wait_event("done", job="66-gpu-bench.job")
        assert not runner.events("gpu-wait")
    finally:
        kill_quietly(pid)


def test_keep_leaks_lets_it_live_and_status_names_the_job_that_left_it(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    server = _fake_server(tmp_path)
    write_job(
        queue_root,
        "65-gpu-intake.job",
        f"# LANE=gpu\nenv -i setsid {server} 303 >/dev/null 2>&1 </dev/null &\necho $! > {tmp_path}/pid\nsleep 0.2\n",
    )
    write_job(queue_root, "66-gpu-bench.job", "# LANE=gpu\necho bench\n")
    runner.start("--keep-leaks", "--gpu-names", server.name)
    pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip()))
    try:
        wait = runner.wait_event("gpu-wait", job="66-gpu-bench.job")
        assert wait["pid"] == pid and wait["left_by"] == "65-gpu-intake.job"
        # status.json is rewritten at the end of the tick that wrote the event: wait for that one (a status of an
        # earlier tick has it behind 65 in its lane, `order` or `lane-busy`, however slow the machine is)
        reason = wait_for(
            lambda: next(
                (
                    q
                    for q in runner.status()["queued"]
                    if q["job"] == "66-gpu-bench.job" and q["reason"] not in ("lane-busy", "order")
                ),
                None,
            ),
            10,
        )
        assert reason["reason"] == "gpu-foreign" and "left by job 65-gpu-intake.job" in reason["detail"]
        assert pid_alive(pid) and not runner.events("orphans-killed")
    finally:
        kill_quietly(pid)
    runner.wait_event("done", job="66-gpu-bench.job")


def test_runner_start_carries_the_previous_lifes_last_heartbeat(queue_root: Path) -> None:
    first = RunnerProcess(queue_root).start()
    wait_for(lambda: first.status()["runner"]["tick"] >= 2)
    first.stop(signal.SIGKILL)
    beat = first.status()["runner"]["heartbeat_ts"]
    second = RunnerProcess(queue_root).start()
    try:
        starts = wait_for(lambda: len(second.events("runner-start")) == 2 and second.events("runner-start"))
        assert starts[0]["last_alive"] is None and starts[1]["last_alive"] == beat
    finally:
        second.stop()


# -- thresholds and once-only reports, by driving tick(now) in-process over fake processes (tests/ticking.py) --
def _names(root: Path) -> list[str]:
    return [e["event"] for e in read_events(root)]


def test_heartbeat_event_only_after_a_silence(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    t0 = time.time()
    runner = ticking(t0, heartbeat_event_s=600.0)
    runner.tick(t0)
    runner.tick(t0 + 599)
    assert "heartbeat" not in _names(queue_root)
    runner.tick(t0 + 600)
    runner.tick(t0 + 601)
    beats = [e for e in read_events(queue_root) if e["event"] == "heartbeat"]
    assert len(beats) == 1 and beats[0]["job"] == "-"
    runner.tick(t0 + 1200)
    assert _names(queue_root).count("heartbeat") == 2


def test_refused_retry_and_cancel_write_no_event(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    runner = ticking()
    (queue_root / "control").mkdir(exist_ok=True)
    (queue_root / "control/retry-nothere.job").write_text('{"by": "me"}')
    (queue_root / "control/cancel-nothere.job").write_text('{"by": "me"}')
    write_job(queue_root, "9-cpu-x.job", "echo\n", state="failed")
    (queue_root / "control/retry-9-cpu-x.job").write_text('{"by": "me"}')
    runner.tick(time.time())
    assert not os.listdir(queue_root / "control")
    retries = [e for e in read_events(queue_root) if e["event"] in ("retry", "cancelled")]
    assert [(e["event"], e["job"]) for e in retries] == [("retry", "9-cpu-x.job")]


def test_settle_rule_by_tick(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    runner = ticking(settle_s=1.0)
    path = write_job(queue_root, "1-cpu-a.job", "# REQUIRES=test -f never\necho\n")
    mtime = path.stat().st_mtime

    def reason(now: float) -> str:
        runner.tick(now)
        return runner.runner.reasons["1-cpu-a.job"].reason

    assert reason(mtime + 0.5) == "settling"
    assert reason(mtime + 1.0) == "requires"
    with open(path, "a") as handle:  # written again in place: settles again, from its new mtime
        handle.write("echo more\n")
    mtime = path.stat().st_mtime
    assert reason(mtime + 0.2) == "settling"
    # An mtime ahead of our clock (another host's, over NFS): unchanged across scans --settle apart settles it.
    os.utime(path, (mtime + 3600, mtime + 3600))
    assert reason(mtime + 1) == "settling" and reason(mtime + 1.9) == "settling"
    assert reason(mtime + 2.0) == "requires"


def test_state_corrupt_is_said_once_per_problem(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    runner = ticking()
    (queue_root / "parked.json").write_text("[1, 2]")
    t0 = time.time()
    for i in range(3):
        runner.tick(t0 + i)
    corrupt = [e for e in read_events(queue_root) if e["event"] == "state-corrupt"]
    assert [(e["file"], e["field"]) for e in corrupt] == [("parked.json", "(whole file)")]
    assert runner.runner.controls.park == "parked"
    (queue_root / "parked.json").write_text('{"since": 5, "reason": "reboot"}')
    runner.tick(t0 + 4)
    corrupt = [e for e in read_events(queue_root) if e["event"] == "state-corrupt"]
    assert [(e["file"], e["field"]) for e in corrupt][1:] == [("parked.json", "since")]
    assert runner.runner.controls.park == "parked since ?: reboot"
    (queue_root / "parked.json").write_text('{"since": "2026-12-04 09:15:30", "reason": "", "by": "me@ws"}')
    runner.tick(t0 + 5)
    assert runner.runner.controls.park == "parked since 2026-12-04 09:15:30"  # no reason: no colon before nothing


def test_a_state_file_that_cannot_be_kept_is_said_and_retried(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    q = ticking(T0)
    q.tick(T0)
    (queue_root / "state.json").unlink()
    (queue_root / "state.json").mkdir()  # os.replace onto a non-empty directory fails (EISDIR/ENOTEMPTY)
    (queue_root / "state.json/x").touch()
    for t in range(1, 6):
        q.tick(T0 + t)
        assert "cannot write state.json" in q.status()["write_errors"]["state.json"]
    said = [e for e in q.events("state-corrupt") if e["file"] == "state.json"]
    assert len(said) == 1 and said[0]["field"] == "(write)"
    shutil.rmtree(queue_root / "state.json")
    q.tick(T0 + 6)
    assert not q.status()["write_errors"] and (queue_root / "state.json").is_file()


def test_manifest_hash_of_the_wrong_type_is_dropped_and_named() -> None:
    from runner.state import check_manifest

    manifest, problems = check_manifest({"jobs": {"a.job": {"sha": [1], "requires": ["/x"]}}})
    assert manifest is not None and manifest["jobs"] == {"a.job": {"requires": ["/x"]}}
    assert problems == [("jobs.a.job.sha", "expected a string, got list: ignored")]


def test_the_runner_keeps_manifest_entries_compact_and_checks_them_as_they_are_read(tmp_path: Path) -> None:
    from runner.queue import Queue
    from runner.state import JobEntry

    entry = {"sha": "ab", "after": ["p.job"], "requires": ["/x"], "outputs": ["/y"], "lane": "cpu", "family": "f"}
    bad = {"sha": "cd", "after": "p.job", "requires": []}  # `after` not a list: reported, as before
    plans = {"p": {"by": "me", "hash": "h", "pushed_at": "now", "jobs": {"a.job": entry}}}
    raw = {"jobs": {"a.job": entry, "b.job": bad}, "producers": {"/x": ["p.job"]}, "plans": plans}
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    manifest, problems = Queue(tmp_path).read_manifest(compact=True)
    assert manifest is not None and problems == [("jobs.b.job.after", "expected a list of strings, got str: used []")]
    kept = manifest["jobs"]["a.job"]
    assert isinstance(kept, JobEntry) and kept.get("after") == ("p.job",) and kept["sha"] == "ab"
    assert dict(kept) == {
        "requires": ("/x",),
        "after": ("p.job",),
        "family": "f",
        "sha": "ab",
    }  # the header has the rest
    assert manifest["jobs"]["b.job"] == {"sha": "cd", "after": [], "requires": []}
    assert manifest["plans"] == {"p": {"by": "me", "hash": "h", "pushed_at": "now"}}  # its jobs never kept
    assert Queue(tmp_path).read_manifest()[0]["plans"] == plans  # as a reader other than the runner reads it


def test_fifos_in_a_queue_never_hold_a_status_logs_watch_or_push(tmp_path: Path, queue_root: Path) -> None:
    """A FIFO as a job file, as events.jsonl and as a job's log: what reads the queue for `plan` (the agent)
    opens files only when they are regular, so no command waits on a FIFO (and says the host unreachable)."""
    from runner.queue import Queue
    from tests.conftest import plan_cli

    log = Queue(queue_root).log_path("b.job")
    fifos = [queue_root / "queue/a.job", queue_root / "events.jsonl", log, queue_root / "stamps/c.json"]
    log.parent.mkdir(exist_ok=True)
    (queue_root / "stamps").mkdir()
    for fifo in fifos:
        os.mkfifo(fifo)
    write_job(queue_root, "b.job", "echo b\n", state="failed")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\njobs:\n  - name: c\n    run: echo c\n")
    blocked: list[str] = []
    done = threading.Event()

    def watchdog() -> None:
        """After 3 s, whoever still reads a FIFO is let go (end-of-file) and named: a hang is a failure."""
        while not done.wait(3):
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:  # ENXIO: nobody has it open for reading
                    continue
                blocked.append(fifo.name)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        results = {
            "status": plan_cli("status", str(queue_root)),
            "logs": plan_cli("logs", str(queue_root), "b.job"),
            "watch": plan_cli("watch", str(queue_root), "--once", "--state", str(tmp_path / "w.json")),
            "push": plan_cli("push", str(queue_root), str(plan), "--dry-run"),
        }
    finally:
        done.set()
        thread.join()
    assert blocked == [], blocked
    for command, (_, out) in results.items():
        assert "unreachable" not in out and "Traceback" not in out, (command, out)
    assert results["push"][0] == 0 and "+  c.job" in results["push"][1], results["push"]
    assert results["status"][0] == 0, results["status"]
