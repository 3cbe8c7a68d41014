"""Cheaper ticks: status.json written only on change, heartbeat.json every tick, a scan that reads what changed,
and a new file picked up between ticks (real runner process, --tick 30)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.queue import fresh_status
from tests.conftest import REPO, read_events, wait_for, write_job
from tests.ticking import Ticking

T0 = 1_000_000.0


def _put(root: Path, name: str, text: str) -> None:
    """A job file as a push writes it: complete, then renamed into queue/."""
    tmp = root / "queue" / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, root / "queue" / name)


def test_status_json_is_rewritten_only_when_it_changes_and_the_heartbeat_every_tick(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    for i in range(3):
        write_job(queue_root, f"{i}-cpu-w.job", f"# REQUIRES=test -f {queue_root}/in{i}\nwork\n")
    q = ticking(T0)
    q.tick(T0)
    writes = q.runner.statusfile.writes
    before = (queue_root / "status.json").read_bytes()
    for t in range(1, 5):
        q.tick(T0 + t)
        beat = json.loads((queue_root / "heartbeat.json").read_text())
        assert beat["heartbeat"] == T0 + t and beat["tick"] == q.runner.ticks
    assert q.runner.statusfile.writes == writes and (queue_root / "status.json").read_bytes() == before
    # every reader sees the fresh heartbeat through fresh_status
    status = fresh_status(queue_root, json.loads(before))
    assert status["runner"]["heartbeat"] == T0 + 4 and status["runner"]["tick"] == q.runner.ticks
    # one job's reason changes: the file is rewritten once, with the other entries as they were
    kept = {e["job"]: e for e in q.status()["queued"] if e["job"] != "1-cpu-w.job"}
    (queue_root / "in1").touch()
    q.tick(T0 + 5)
    assert q.runner.statusfile.writes == writes + 1
    assert "1-cpu-w.job" in q.procs.running()
    assert q.status()["queued"] == list(kept.values())
    # at least every REFRESH_S, so that a reader older than heartbeat.json never sees it as dead
    q.procs.exit("1-cpu-w.job")
    q.tick(T0 + 6)
    writes = q.runner.statusfile.writes
    q.tick(T0 + 6 + 61)
    assert q.runner.statusfile.writes == writes + 1
    assert q.status()["runner"]["heartbeat"] == T0 + 67


def test_a_running_jobs_elapsed_time_follows_the_heartbeat(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "1-cpu-a.job", "work\n")
    q = ticking(T0)
    q.tick(T0)
    q.tick(T0 + 1)
    q.tick(T0 + 2)  # nothing changed in status.json but the clock
    raw = q.status()
    assert raw["running"][0]["elapsed_s"] == pytest.approx(raw["runner"]["heartbeat"] - raw["running"][0]["started"])
    fresh = fresh_status(queue_root, q.status())
    assert fresh["runner"]["heartbeat"] == T0 + 2 and fresh["running"][0]["elapsed_s"] == 2.0


def test_an_old_runners_status_json_is_read_as_it_is(tmp_path: Path) -> None:
    old = {"runner": {"pid": 1, "instance": "aaaa", "heartbeat": 100.0, "tick": 3}, "running": [{"elapsed_s": 5}]}
    assert fresh_status(tmp_path, json.loads(json.dumps(old))) == old  # no heartbeat.json: an older runner
    (tmp_path / "heartbeat.json").write_text(json.dumps({"instance": "bbbb", "heartbeat": 900.0, "tick": 9}))
    assert fresh_status(tmp_path, json.loads(json.dumps(old))) == old  # another life's heartbeat
    (tmp_path / "heartbeat.json").write_text(json.dumps({"instance": "aaaa", "heartbeat": 130.0, "tick": 9}))
    fresh = fresh_status(tmp_path, json.loads(json.dumps(old)))
    assert fresh["runner"]["heartbeat"] == 130.0 and fresh["runner"]["tick"] == 9
    assert fresh["running"][0]["elapsed_s"] == 35
    (tmp_path / "heartbeat.json").write_text("{torn")
    assert fresh_status(tmp_path, json.loads(json.dumps(old))) == old


def test_a_watched_scan_reads_only_what_changed(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    for i in range(20):
        write_job(queue_root, f"{i:02d}-cpu-w.job", f"# REQUIRES=test -f {queue_root}/never\nwork {i}\n")
    q = ticking(T0)
    assert q.runner.watch_dirs(), "inotify is expected on this machine"
    scanner = q.runner.scanner
    read: list[str] = []
    real_read = scanner._read

    def counting(now: float, name: str, path: str):  # type: ignore[no-untyped-def]
        read.append(name)
        return real_read(now, name, path)

    scanner._read = counting  # type: ignore[method-assign]
    q.tick(T0)  # the first scan lists and reads every file
    assert len(read) == 20
    read.clear()
    q.tick(T0 + 1)
    assert read == []  # nothing changed: no file looked at
    _put(queue_root, "50-cpu-new.job", "# REQUIRES=test -f /never\nnew\n")
    write_job(queue_root, "03-cpu-w.job", "# LANE=gpu\n# REQUIRES=test -f /never\nrewritten in place\n")
    (queue_root / "queue/07-cpu-w.job").unlink()
    q.tick(T0 + 2)
    assert sorted(read) == ["03-cpu-w.job", "07-cpu-w.job", "50-cpu-new.job"]
    queued = {e["job"]: e["lane"] for e in q.status()["queued"]}
    assert "07-cpu-w.job" not in queued and queued["50-cpu-new.job"] == "cpu" and queued["03-cpu-w.job"] == "gpu"
    assert len(queued) == 20


def test_lost_events_fall_back_to_a_full_scan(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "1-cpu-a.job", "# REQUIRES=test -f /never\nwork\n")
    q = ticking(T0)
    assert q.runner.watch_dirs()
    q.tick(T0)
    assert q.runner.watch is not None
    q.runner.watch.lost = True  # as an overflowed inotify queue says
    write_job(queue_root, "2-cpu-b.job", "# REQUIRES=test -f /never\nwork\n")
    q.runner.watch.drain()  # its events are gone: only the full scan can find the file
    q.runner.watch.lost = True
    q.tick(T0 + 1)
    assert [e["job"] for e in q.status()["queued"]] == ["1-cpu-a.job", "2-cpu-b.job"]


def test_a_new_job_file_starts_long_before_the_next_tick(tmp_path: Path) -> None:
    """--tick 30: the runner ticks once at start, then only a wake-up (inotify, or the 50 ms directory poll) can
    start a job renamed into queue/ (or a `plan retry` dropped into control/) before 30 s have passed."""
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(root), "--tick", "30", "--settle", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("w"),
    )
    try:
        wait_for(lambda: (root / "heartbeat.json").exists(), 20)
        started = time.monotonic()
        _put(root, "1-cpu-a.job", "exit 0\n")
        wait_for(lambda: any(e["event"] == "done" for e in read_events(root)), 25)
        _put(root, "2-cpu-b.job", "exit 3\n")
        wait_for(lambda: any(e["event"] == "failed" for e in read_events(root)), 25)
        # a retry request in control/ is picked up at once too
        from runner.controls import request_name

        (root / "control").mkdir(exist_ok=True)
        tmp = root / "control" / ".req.tmp"
        tmp.write_text(json.dumps({"by": "test"}))
        os.replace(tmp, root / "control" / request_name("retry", "2-cpu-b.job"))
        wait_for(lambda: sum(e["event"] == "start" for e in read_events(root)) == 3, 25)
        assert time.monotonic() - started < 30, "only the next tick could explain this: no wake-up"
        ticks = json.loads((root / "heartbeat.json").read_text())["tick"]
        assert ticks < 20  # woken by files, not spinning
    finally:
        proc.terminate()
        proc.wait(timeout=30)
