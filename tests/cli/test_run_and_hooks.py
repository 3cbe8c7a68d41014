"""`plan run` on the demo plan as a real process, then again in-process; a failing job; a root already served.

The pre-push hook (its own real processes) is tested in tests/cli/test_hook_env.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, RunnerProcess, pid_alive, wait_for, write_job
from tests.inprocess import plan_main
from tests.ticking import Ticking


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
    # run again: the job that failed before says so, and how to run it again (its note was empty)
    again = plan_main("run", str(plan), "--root", str(tmp_path / "q"), cwd=tmp_path, cache=tmp_path / "cache")
    assert again.returncode == 1
    assert "failed before this run (--retry-failed runs it again)" in again.stdout, again.stdout


def test_plan_run_says_when_a_retry_starts_and_times_a_failed_job(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    """`plan run`'s lines and summary from a runner's events (driven by tick(now), not 30 s of backoff): a retry
    says which attempt starts and when (its backoff was silence), a failed job has its time (its attempts')."""
    from plancompiler.commands.run import RunSummary, _follow

    write_job(queue_root, "f1.job", "# RETRIES=2\nexit 3\n")
    now = 1_000_000.0
    q = ticking(now, backoff_base_s=30.0)
    q.tick(now)
    q.say("f1.job", "oops")
    q.procs.exit("f1.job", 3)
    q.tick(now + 4)
    q.tick(now + 34)
    q.say("f1.job", "oops again")
    q.procs.exit("f1.job", 3)
    q.tick(now + 40)
    lines: list[str] = []
    summary = RunSummary(["f1.job"])
    _follow(queue_root / "events.jsonl", 0, summary, lines.append)
    said = [line[10:] for line in lines if " f1.job " in line]  # after the time of day
    assert said[1] == "retry          f1.job  rc 3: oops (attempt 2 of 2 in 30s)", said
    assert said[3] == "failed         f1.job  rc 3: oops again", said
    assert summary.table().splitlines()[1].split() == ["f1.job", "failed", "10s", "rc", "3"]  # 4 s and 6 s


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


@pytest.mark.long
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_plan_run_ended_by_a_signal_stops_its_runner_and_says_so(tmp_path: Path, sig: signal.Signals) -> None:
    """A closed terminal (HUP), `timeout` or a CI cancel (TERM), Ctrl-C (INT): `plan run` stops the runner it
    started, whose running job goes back to queue/ with no attempt used, says what happened and exits 128 + the
    signal. TERM and HUP once ended `plan run` at once and left its runner serving the root for good."""
    root, started = tmp_path / "q", tmp_path / "started"
    plan = tmp_path / "p.yaml"
    plan.write_text(f"plan: p\njobs:\n  - name: slow\n    run: touch {started}; sleep 60\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plancompiler.cli", "run", str(plan), "--root", str(root), "--tick", "0.2"],
        env=_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    runner_pid = 0
    try:
        wait_for(lambda: started.exists() and (root / "status.json").exists(), 30)
        runner_pid = json.loads((root / "status.json").read_text())["runner"]["pid"]
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig, out
        assert (
            f"plan: {sig.name}: the run is stopped; its runner put the jobs it was running back in {root}/queue/" in out
        )
        assert "Traceback" not in out
        assert not pid_alive(runner_pid), "the runner plan run started is stopped with it"
        assert os.listdir(root / "queue") == ["slow.job"], out  # back, not in running/ nor failed/
        assert stat.S_IMODE((root / "runner.log").stat().st_mode) == 0o600  # as every file of the root
    finally:
        if proc.poll() is None:  # (a failure above: neither is left running)
            proc.kill()
            proc.communicate()
        if runner_pid and pid_alive(runner_pid):
            os.kill(runner_pid, signal.SIGTERM)  # it ends its job and exits
            wait_for(lambda: not pid_alive(runner_pid), 30)


def test_plan_run_takes_no_verify_external_as_plan_push_does(tmp_path: Path) -> None:
    """A plan whose `external:` path is not there yet: `plan run` refuses it as a push does, and the refusal's own
    advice (--no-verify-external) is a flag `plan run` takes."""
    plan = tmp_path / "ext.yaml"
    plan.write_text(f"plan: ext\nexternal: [{tmp_path}/later]\njobs:\n  - name: a\n    run: echo hi\n")
    args = ("run", str(plan), "--root", str(tmp_path / "q"), "--tick", "0.2")
    refused = plan_main(*args, cwd=tmp_path, cache=tmp_path / "cache")
    assert refused.returncode == 1 and "--no-verify-external to push anyway" in refused.stdout + refused.stderr
    ran = plan_main(*args, "--no-verify-external", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 0 and "1/1 done" in ran.stdout, ran.stdout + ran.stderr
