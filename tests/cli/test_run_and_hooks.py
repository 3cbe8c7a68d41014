"""`plan run` on the demo plan as a real process, then again in-process; a failing job; a root already served.

The pre-push hook (its own real processes) is tested in tests/cli/test_hook_env.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, RunnerProcess
from tests.inprocess import plan_main


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PLAN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}


@pytest.mark.long
def test_plan_run_demo_completes_then_skips_everything(tmp_path: Path) -> None:
    root, work = tmp_path / "q", tmp_path / "work"
    argv = [
        sys.executable,
        "-m",
        "plancompiler.cli",
        "run",
        str(REPO / "plans/demo.yaml"),
        "--root",
        str(root),
        "--set",
        f"work={work}",
    ]
    first = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp_path), timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "6 new" in first.stdout and "6/6 done" in first.stdout
    assert "start          30-gpu-intake-tiny-a.job" in first.stdout
    assert (work / "bench.jsonl").exists()
    assert "orphans-killed" not in first.stdout  # the intakes end their own servers: no false alert
    second = plan_main(*argv[3:], cwd=tmp_path, cache=tmp_path / "cache")  # the same command in this process
    assert second.returncode == 0, second.stdout + second.stderr
    assert "6 done" in second.stdout and " start " not in second.stdout
    assert second.stdout.count("already done") == 6
    # no runner is left behind
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _runner_on(int(p), root)]


def _runner_on(pid: int, root: Path) -> bool:
    try:
        return f"--root\0{root}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_plan_run_exits_1_when_a_job_fails(tmp_path: Path) -> None:
    plan = tmp_path / "bad.yaml"
    plan.write_text("plan: bad\njobs:\n  - name: a\n    run: echo broken; exit 3\n  - name: b\n    run: echo ok\n")
    out = plan_main("run", str(plan), "--root", str(tmp_path / "q"), cwd=tmp_path, cache=tmp_path / "cache")
    assert out.returncode == 1
    assert "1/2 done" in out.stdout and "failed" in out.stdout


def test_plan_run_on_a_root_another_runner_serves_follows_that_runner(tmp_path: Path) -> None:
    root = tmp_path / "q"
    serving = RunnerProcess(root).start()
    try:
        plan = tmp_path / "p.yaml"
        # The job ends only once `plan run`'s own runner has said why it exits (into ROOT/runner.log): on a busy
        # machine that runner starts late, and a job already done would leave nothing to follow.
        said = f"grep -qs 'already serves' {root}/runner.log"
        plan.write_text(
            f'plan: p\njobs:\n  - name: a\n    run: "until {said}; do sleep 0.1; done; sleep 0.5; echo a > {tmp_path}/a.out"\n'
            f"    outputs: [{tmp_path}/a.out]\n"
        )
        out = plan_main("run", str(plan), "--root", str(root), cwd=tmp_path, cache=tmp_path / "cache")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"another runner (pid {serving.proc.pid}) already serves {root}: following it" in out.stdout
        assert "1/1 done" in out.stdout and "stopped" not in out.stdout and "exited with" not in out.stdout
        assert serving.proc.poll() is None  # the runner that served the root was left running
    finally:
        serving.stop()
