"""`runner run --metrics FILE`: Prometheus text for node_exporter's textfile collector, parsed here with
prometheus_client's own parser (the test extra)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, RunnerProcess, wait_for, write_job
from tests.sshd import IN_CI

try:
    from prometheus_client import parser
except ImportError:  # the test extra has it; CI installs that extra, so there it must be found
    if IN_CI:
        raise
    pytest.skip("prometheus_client not installed (pip install -e '.[test]')", allow_module_level=True)

NOW = 1_000_000.0


def _metrics(path: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value}, as prometheus_client reads the file."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parser.text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_each_tick_writes_job_lane_and_reason_gauges_that_prometheus_parses(
    tmp_path: Path, queue_root: Path, ticking: Any
) -> None:
    path = tmp_path / "textfile" / "plan.prom"
    path.parent.mkdir()
    write_job(queue_root, "1-cpu-a.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "2-cpu-b.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "3-gpu-c.job", f"# LANE=gpu\n# REQUIRES=test -f {tmp_path / 'never'}\ntrue\n")
    write_job(queue_root, "4-cpu-d.job", "# LANE=cpu\nexit 3\n")
    run = ticking(metrics_path=path, slots={"cpu": 2}).tick(NOW)
    metrics = _metrics(path)
    assert metrics["plan_jobs"][(("lane", "cpu"), ("state", "running"))] == 2
    assert metrics["plan_jobs"][(("lane", "cpu"), ("state", "queued"))] == 1
    assert metrics["plan_jobs"][(("lane", "gpu"), ("state", "queued"))] == 1
    assert metrics["plan_jobs"][(("lane", "net"), ("state", "running"))] == 0
    assert metrics["plan_jobs_waiting"][(("reason", "requires"),)] == 1
    assert metrics["plan_jobs_waiting"][(("reason", "order"),)] == 1  # behind the two that started this tick
    assert metrics["plan_jobs_waiting"][(("reason", "blocked"),)] == 0  # every reason has its series
    assert metrics["plan_lane_slots"][(("lane", "cpu"),)] == 2
    assert metrics["plan_lane_busy_slots"][(("lane", "cpu"),)] == 2
    assert metrics["plan_queue_files"][(("state", "queue"),)] == 2
    assert metrics["plan_runner_heartbeat_timestamp_seconds"][()] == NOW
    assert metrics["plan_job_attempt"][(("job", "1-cpu-a.job"), ("lane", "cpu"))] == 1
    assert metrics["plan_runner_tick_duration_seconds"][()] > 0
    # the file is readable by the collector's user, and replaced whole (no temp file left for it to read)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["plan.prom"]
    run.procs.exit("1-cpu-a.job", 0)
    run.procs.exit("2-cpu-b.job", 0)
    run.tick(NOW + 90)
    run.procs.exit("4-cpu-d.job", 3)
    run.tick(NOW + 100)
    metrics = _metrics(path)
    assert metrics.get("plan_job_running_seconds", {}) == {}  # nothing runs
    assert metrics["plan_events_total"][(("event", "start"),)] == 3  # attempts
    assert metrics["plan_events_total"][(("event", "failed"),)] == 1
    assert metrics["plan_queue_files"][(("state", "done"),)] == 2
    assert metrics["plan_runner_ticks_total"][()] == 3
    assert metrics["plan_recent_failure_signatures"][()] == 0  # a failure without output has no signature
    # the incident book's: the failure is one open incident; every kind has its series
    assert metrics["plan_incidents_open"][(("kind", "failed"),)] == 1
    assert metrics["plan_incidents_open"][(("kind", "gpu-held"),)] == 0
    assert metrics["plan_incidents_acked"][(("kind", "failed"),)] == 0
    assert metrics["plan_notices_total"][()] >= 1


def test_a_running_job_has_its_age_and_a_failure_its_signature(tmp_path: Path, queue_root: Path, ticking: Any) -> None:
    path = tmp_path / "plan.prom"
    write_job(queue_root, "1-cpu-a.job", "echo boom; exit 3\n")
    write_job(queue_root, "2-cpu-b.job", "sleep 1\n")
    run = ticking(metrics_path=path).tick(NOW)
    run.say("1-cpu-a.job", "error: boom 1234")
    run.procs.exit("1-cpu-a.job", 3)
    run.tick(NOW + 30).tick(NOW + 75)
    metrics = _metrics(path)
    assert metrics["plan_job_running_seconds"] == {(("job", "2-cpu-b.job"), ("lane", "cpu")): 45.0}
    assert list(metrics["plan_recent_failures"].values()) == [1]
    assert metrics["plan_recent_failure_signatures"][()] == 1


def test_runner_run_metrics_flag_writes_the_file(tmp_path: Path, queue_root: Path) -> None:
    path = tmp_path / "plan.prom"
    runner = RunnerProcess(queue_root).start("--metrics", str(path))
    try:
        write_job(queue_root, "1-cpu-a.job", "true\n")
        wait_for(lambda: path.exists() and _metrics(path)["plan_queue_files"][(("state", "done"),)] == 1)
        info = _metrics(path)["plan_runner_info"]
        assert [dict(labels)["pid"] for labels in info] == [str(runner.proc.pid)]  # type: ignore[union-attr]
    finally:
        runner.stop()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "run",
            "--root",
            str(queue_root),
            "--metrics",
            str(tmp_path / "no" / "x.prom"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=30,
    )
    assert bad.returncode == 2 and "--metrics" in bad.stderr and "Traceback" not in bad.stderr
