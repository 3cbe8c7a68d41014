"""`plan run` on the demo plan as a real process, twice; the pre-push hook refusing a bad plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, RunnerProcess


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PLAN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}


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
    second = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp_path), timeout=120, cwd=tmp_path)
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
    out = subprocess.run(
        [sys.executable, "-m", "plancompiler.cli", "run", str(plan), "--root", str(tmp_path / "q")],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert out.returncode == 1
    assert "1/2 done" in out.stdout and "failed" in out.stdout


def test_plan_run_on_a_root_another_runner_serves_follows_that_runner(tmp_path: Path) -> None:
    root = tmp_path / "q"
    serving = RunnerProcess(root).start()
    try:
        plan = tmp_path / "p.yaml"
        plan.write_text(
            f"plan: p\njobs:\n  - name: a\n    run: sleep 0.5; echo a > {tmp_path}/a.out\n"
            f"    outputs: [{tmp_path}/a.out]\n"
        )
        out = subprocess.run(
            [sys.executable, "-m", "plancompiler.cli", "run", str(plan), "--root", str(root)],
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"another runner (pid {serving.proc.pid}) already serves {root}: following it" in out.stdout
        assert "1/1 done" in out.stdout and "stopped" not in out.stdout and "exited with" not in out.stdout
        assert serving.proc.poll() is None  # the runner that served the root was left running
    finally:
        serving.stop()


def test_pre_push_hook_refuses_a_plan_with_errors(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        raise AssertionError("git is needed for the hook test")
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "plans/good.yaml").write_text("plan: good\njobs:\n  - name: a\n    run: echo a\n")
    (repo / "plans/hosts.yaml").write_text("hosts:\n  a9: {ssh: a9, root: /home/user/jobs}\n")  # not a plan
    install = subprocess.run(
        [sys.executable, "-m", "plancompiler.cli", "hooks", "install", "--repo", str(repo)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
    )
    assert install.returncode == 0, install.stderr
    hook = repo / ".git/hooks/pre-push"
    assert os.access(hook, os.X_OK)
    ok = subprocess.run([str(hook)], cwd=repo, capture_output=True, text=True, env=_env(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (repo / "plans/bad.yaml").write_text("plan: bad\njobs:\n  - name: a\n    run: exit $rc\n")
    bad = subprocess.run([str(hook)], cwd=repo, capture_output=True, text=True, env=_env(tmp_path))
    assert bad.returncode == 1 and "SC2154" in bad.stdout
