"""Robust at the edges: planted deep JSON, a full disk at start, and bad runner arguments end in a clear
message, never a traceback or a crash loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, RunnerProcess, wait_for, write_job
from tests.fullfs import fill, small_tmpfs

DEEP = "[" * 5000 + "]" * 5000


def runner_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-m", "runner", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def test_json_nested_too_deep_is_corrupt_not_a_crash(queue_root: Path, runner: RunnerProcess) -> None:
    for name in ("state.json", "manifest.json", "parked.json", "status.json"):
        (queue_root / name).write_text(DEEP)
    (queue_root / "control").mkdir()
    (queue_root / "control/cancel-a.job").write_text(DEEP)
    write_job(queue_root, "b.job", "echo b\n")
    runner.start()
    corrupt = {e["file"]: e["why"] for e in runner.events("state-corrupt")}
    assert "nested too deep" in corrupt["state.json"], corrupt
    wait_for(lambda: {e["file"] for e in runner.events("state-corrupt")} >= {"state.json", "manifest.json"})
    wait_for(lambda: "parked.json" in {e["file"] for e in runner.events("state-corrupt")})
    (queue_root / "parked.json").unlink()
    runner.wait_event("done", job="b.job")
    assert runner.proc is not None and runner.proc.poll() is None
    # status.json planted deep (the runner has rewritten it: plant it again) for `runner status`.
    runner.stop()
    (queue_root / "status.json").write_text(DEEP)
    shown = runner_cli("status", "--root", str(queue_root))
    assert shown.returncode == 1 and "not JSON: nested too deep" in shown.stderr and "Traceback" not in shown.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["status", "--root", "/etc/passwd"], "--root /etc/passwd is not a directory"),
        (["run", "--root", "{root}", "--lanes", ""], "--lanes names no lane"),
        (["run", "--root", "{root}", "--tick", "0"], "--tick must be above 0"),
    ],
)
def test_bad_runner_arguments_are_usage_errors(tmp_path: Path, args: list[str], words: str) -> None:
    done = runner_cli(*[a.replace("{root}", str(tmp_path / "q")) for a in args])
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_runner_started_on_a_full_disk_runs_and_drains_once_space_returns(tmp_path: Path) -> None:
    root = tmp_path / "q"
    with small_tmpfs(root, "1m"):
        write_job(root, "a.job", "echo a\n")
        filler = fill(root)
        proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "runner", "run", "--root", str(root), "--tick", "0.1", "--settle", "0"],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stderr=subprocess.PIPE,
        )
        try:
            # Alive with the disk full: no lock file needed, nothing it cannot write is fatal.
            inode = f":{os.stat(root).st_ino} "
            wait_for(lambda: inode in Path("/proc/locks").read_text() or proc.poll() is not None, 10)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert not (root / "status.json").exists(), "the disk is full: nothing was written"
            filler.unlink()
            wait_for(lambda: any(e["event"] == "done" for e in _events(root)), 15)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
        assert b"Traceback" not in (proc.stderr.read() if proc.stderr else b"")


def _events(root: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []
