"""A watcher that was stopped (a laptop asleep) says what happened meanwhile as one DIGEST, never a replay; and
SKEW when the box's clock and the workstation's disagree. Real runner and `plan watch` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from plancompiler.watch import skew_condition
from tests.conftest import REPO, RunnerProcess, wait_for, write_job


def test_a_stopped_watcher_resumed_sends_one_digest(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    runner.start()
    got, state = tmp_path / "alerts.jsonl", tmp_path / "w.json"
    watcher = subprocess.Popen(
        [sys.executable, "-m", "plancompiler.cli", "watch", str(queue_root), "--interval", "0.3", "--state", str(state)]
        + ["--on-alert", f"cat >> {got}; echo >> {got}"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: state.exists() and json.loads(state.read_text()).get("probed_ok"), 20)
        watcher.send_signal(signal.SIGSTOP)  # the laptop sleeps
        stopped = json.loads(state.read_text())["probed_ok"]
        for n, why in enumerate(("disk quota exceeded", "unsupported sampler flag", "connection refused")):
            write_job(queue_root, f"6{n}-cpu-bad.job", f"echo '{why}'; exit {n + 1}\n")
        wait_for(lambda: len(json.loads((queue_root / "incidents.json").read_text())["open"]) == 3, 20)
        beat = queue_root / "heartbeat.json"  # the runner's tick clock: away well past three intervals
        wait_for(lambda: json.loads(beat.read_text())["heartbeat"] > stopped + 1.5, 20)
        watcher.send_signal(signal.SIGCONT)
        wait_for(lambda: got.exists() and got.read_text().strip(), 20)
        after = json.loads(state.read_text())["probed_ok"]
        wait_for(lambda: json.loads(state.read_text())["probed_ok"] > after + 0.5, 20)  # two more probes
        [alert] = [json.loads(line) for line in got.read_text().splitlines() if line.strip()]
        assert alert["kind"] == "DIGEST" and len(alert["alerts"]) == 3
        assert alert["detail"].startswith(f"{queue_root}: while this watcher was away for ")
        assert "3 open: EVENT " in alert["detail"] and "60-cpu-bad.job failed: exited 1: disk quota" in alert["detail"]
    finally:
        watcher.send_signal(signal.SIGCONT)
        watcher.kill()
        watcher.wait()


def test_skew_beyond_a_minute_and_the_probe_s_own_time() -> None:
    assert skew_condition(1000.0 + 30, 1000.0, 1000.0, "a9") is None
    assert skew_condition(1000.0 + 420, 1000.0, 1001.0, "a9") is not None
    late = skew_condition(1000.0 - 420, 1000.0, 1000.4, "a9")
    assert late is not None and late.kind == "SKEW"
    assert late.detail.startswith("the box's clock is 7m00s behind this workstation's")
    assert skew_condition(1000.0 + 80, 1000.0, 1050.0, "a9") is None  # a 50 s probe explains 25 s more
