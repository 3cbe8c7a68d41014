"""A runner that stopped cleanly is said as stopped (when, why, what it leaves waiting), never as dead; one that
ended without a word is dead. What `plan status` shows of a stopped queue is true of it."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.conftest import write_job
from tests.inprocess import plan_main

cli = CliRunner()
NOW = 1_000_000.0


pytestmark = pytest.mark.usefixtures("no_hosts")


def _gone_pid() -> int:
    """The pid of a process that has ended: the runner status.json names is not running."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _plan(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


def test_a_runner_stopped_with_work_queued_is_stopped_not_dead(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("1-a.job", "2-b.job", "3-c.job"):
        write_job(queue_root, name, "sleep 60\n")
    run = ticking(NOW, pid=_gone_pid())
    run.tick(NOW + 1)
    assert run.procs.running() == ["1-a.job"]
    assert {run.reason(job)["reason"] for job in ("2-b.job", "3-c.job")} <= {"lane-busy", "order"}
    run.runner.stop(NOW + 5, "SIGTERM")
    state = str(tmp_path / "w.json")

    code, out = _plan("watch", str(queue_root), "--once", "--state", state)
    assert code == 21, out
    assert "STOPPED: runner pid" in out and "(SIGTERM); 3 jobs queued, none starts until a runner runs" in out
    assert "DEAD" not in out

    code, out = _plan("status", str(queue_root))
    assert code == 0, out
    first = out.splitlines()[0]
    assert first.startswith("STOPPED: runner pid") and first.endswith(
        "(SIGTERM); 3 jobs queued, none starts until a runner runs"
    )
    # its lanes say stopped; nothing it put back is said to run, no lane is None, nothing has a start
    assert "cpu   stopped" in out and "queue 3  running 0" in out
    for untrue in ("is running in", "is ahead of it", "None", "est. start", "reasons as of"):
        assert untrue not in out

    code, out = _plan("top", "--once", str(queue_root))
    assert "(SIGTERM)" in out.splitlines()[1] and "NOT RUNNING" not in out and "! STOPPED" in out
    from runner.__main__ import main as runner_main  # the box's own `runner status` says it the same way

    assert runner_main(["status", "--root", str(queue_root)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == first


def test_a_stopped_runner_with_nothing_queued_is_quiet_and_a_killed_one_is_dead(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Any]
) -> None:
    pid = _gone_pid()
    run = ticking(NOW, pid=pid)
    run.tick(NOW + 1)
    run.runner.stop(NOW + 2, "SIGINT")
    run.runner.release_lock()  # as its process's end does
    state = str(tmp_path / "w.json")
    assert _plan("watch", str(queue_root), "--once", "--state", state) == (0, "")
    assert _plan("status", str(queue_root))[1].startswith(f"STOPPED: runner pid {pid} stopped at ")
    # a later runner that ended without a runner-stop (killed, crashed) is dead, whatever the one before said
    again = ticking(NOW + 10, pid=pid)
    again.tick(NOW + 11)
    code, out = _plan("watch", str(queue_root), "--once", "--state", state)
    assert code == 14 and out.startswith("DEAD: runner ") and "STOPPED" not in out


def test_plan_run_says_it_started_the_runner_and_that_it_stopped(tmp_path: Path) -> None:
    plan = tmp_path / "ok.yaml"
    plan.write_text("plan: ok\njobs:\n  - name: a\n    run: echo ok\n")
    root = tmp_path / "q"
    out = plan_main("run", str(plan), "--root", str(root), cwd=tmp_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    code, said = _plan("status", str(root))
    assert "\nstarted: plan run (pid " in said
    assert said.startswith("STOPPED: runner pid ") and "(SIGTERM); nothing is queued" in said
    assert _plan("watch", str(root), "--once", "--state", str(tmp_path / "w.json")) == (0, "")


def test_status_says_a_running_job_s_age_now_and_what_each_count_counts(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Any], stand_in: int
) -> None:
    began = time.time() - 40
    for name in ("1-a.job", "2-b.job"):
        write_job(queue_root, name, "sleep 60\n")
    run = ticking(began, pid=stand_in)
    run.tick(began + 1)  # 1-a starts; status.json says it has run 0 s, and says so until the next tick
    write_job(queue_root, "3-c.job", "sleep 60\n")  # put there by another process: the runner judges it next sweep
    code, out = _plan("status", str(queue_root))
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if "1-a.job" in ln and "attempt 1" in ln)
    assert re.search(r"1-a\.job  (39|40|41|42)s  attempt 1", line), line  # its age now, from when it started
    assert "jobs: queue 2  running 1" in out  # the files there now, as the agent counted them
    assert "waiting (1 as the runner last judged them; 2 in queue/ now):" in out


def test_report_says_the_runner_stopped_and_what_it_put_back(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Any]
) -> None:
    write_job(queue_root, "1-a.job", "sleep 60\n")
    run = ticking(NOW, pid=_gone_pid())
    run.tick(NOW + 1)
    run.runner.stop(NOW + 5, "SIGTERM")
    code, out = _plan("report", str(queue_root))
    assert code == 0, out
    assert "\nrunner: stopped at " in out and "(SIGTERM); not running for " in out
    assert "1-a.job  cpu  1 attempt  requeued" in out  # put back in the queue: not an outcome nobody saw
    assert "outcome unknown" not in out and "last sign of life" not in out


def test_status_says_when_the_job_a_reason_names_as_running_has_ended_since(
    queue_root: Path, ticking: Callable[..., Any]
) -> None:
    from runner.views.status import render_status

    for name in ("1-a.job", "2-b.job", "3-c.job", "4-d.job"):
        write_job(queue_root, name, "sleep 60\n")
    run = ticking(NOW)
    run.tick(NOW + 1).tick(NOW + 2)
    assert "on 1-a.job  oldest 2-b.job 1s: 1-a.job is running in cpu" in render_status(run.status(), NOW + 3)
    run.procs.exit("1-a.job", 0)
    run.runner.tick(NOW + 4, sweep=False)  # its end: its lane's next job starts, the rest wait for the sweep
    text = render_status(run.status(), NOW + 5)
    assert "cpu   2-b.job" in text and "1-a.job is running" not in text
    assert "4-d.job 3s: 1-a.job has ended since (judged again at the runner's next sweep)" in text
