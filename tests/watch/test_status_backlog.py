"""`plan status` at backlog size (issue 30): waiting jobs grouped by reason and blocker, `--all` for every job,
long conditions cut in the middle, one log tail for progress; and `plan bootstrap --start` without systemd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.views.waiting import cut_middle, group_waiting
from tests.conftest import REPO, RunnerProcess, pid_alive, plan_cli, wait_for, write_job
from tests.sshd import Sshd

pytestmark = pytest.mark.usefixtures("plan_env")
DEEP = "/home/user/work/a9-agent-bench/agent-playground/bench/a9-results/matrix/strata"


def test_the_view_model_groups_by_reason_and_blocker_with_the_oldest_first() -> None:
    now = 10_000.0
    queued = [
        {"job": f"84c-{i:03d}.job", "reason": "requires", "since": now - i, "detail": f"test -f {DEEP}/s-{i}.json"}
        for i in range(259)
    ]
    queued += [
        {"job": f"9{i}-gpu.job", "reason": "exclusive", "since": now - 5, "detail": "n holds net", "blocker": "n.job"}
        for i in range(4)
    ]
    queued += [
        {"job": f"b{i}.job", "reason": "blocked", "since": now, "detail": "x", "blocker": f"p{i}"} for i in range(5)
    ]
    groups = group_waiting(queued, now)
    assert [(g.reason, g.blocker, g.count) for g in groups] == [
        ("blocked", "", 5),  # more blockers than MAX_BLOCKERS: one group, each job's detail says its own
        ("exclusive", "n.job", 4),
        ("requires", "", 259),
    ]
    assert [w.job for w in groups[2].oldest] == ["84c-258.job", "84c-257.job", "84c-256.job"]
    cut = cut_middle(f"test -f {DEEP}/strata-qwen-q2_0.json", 48)
    assert len(cut) == 48 and cut.startswith("test -f /home/") and cut.endswith("/strata-qwen-q2_0.json") and "…" in cut


def test_status_of_a_backlog_is_grouped_and_all_lists_every_job(tmp_path: Path, queue_root: Path) -> None:
    gate = tmp_path / "gate"
    write_job(
        queue_root,
        "1-net-dl.job",
        f"# LANE=net\necho 'PROGRESS: 1/6'\nwhile [ ! -e {gate} ]; do sleep 0.1; done\n"
        f"echo 'PROGRESS: 3/6'\nwhile [ ! -e {gate}.end ]; do sleep 0.2; done\n",
    )
    for i in range(6):
        write_job(queue_root, f"5{i}-gpu-bench.job", "# LANE=gpu\ntrue\n")
    for i in range(40):
        write_job(
            queue_root,
            f"84c-cpu-strata-{i:02d}.job",
            f"# LANE=cpu\n# REQUIRES=test -f {DEEP}/strata-{i:02d}.json\ntrue\n",
        )
    runner = RunnerProcess(queue_root).start("--tick", "60")  # status.json stays as the first tick wrote it
    try:
        runner.wait_event("start", job="1-net-dl.job")
        wait_for(lambda: len(runner.status()["queued"]) == 46)
        log = queue_root / "logs/1-net-dl.job.log"
        wait_for(lambda: "PROGRESS: 1/6" in log.read_text())
        gate.touch()
        wait_for(lambda: "PROGRESS: 3/6" in log.read_text())
        raw = json.loads((queue_root / "status.json").read_text())
        assert "3/6" not in str(raw["running"])  # status.json is as old as the sweep that wrote it
        code, out = plan_cli("status", str(queue_root))
        assert code == 0, out
        lines = out.splitlines()
        assert "        50% (3/6)" in lines and "        | PROGRESS: 3/6" in lines and "1/6" not in out  # one source
        assert "waiting (46):" in lines and len(lines) < 25
        requires = next(ln for ln in lines if ln.startswith("  requires"))
        assert "40 jobs  oldest 84c-cpu-strata-" in requires and requires.endswith(".json")
        assert "…" in requires and "/strata-" in requires[requires.index("…") :]  # cut in the middle, name kept
        exclusive = next(ln for ln in lines if ln.startswith("  exclusive"))
        assert "6 jobs  on 1-net-dl.job  oldest 50-gpu-bench.job" in exclusive
        assert "  (40 more waiting: --all lists every job)" in lines
        code, out = plan_cli("status", str(queue_root), "--all")
        assert code == 0 and sum("84c-cpu-strata-" in ln for ln in out.splitlines()) == 40
        assert sum("-gpu-bench.job" in ln for ln in out.splitlines()) == 6
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for flags, lines_of_strata in (([], 3), (["--all"], 40)):  # `runner status` on the box: the same view
            argv = [sys.executable, "-S", "-m", "runner", "status", "--root", str(queue_root), *flags]
            shown = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60).stdout
            assert sum("84c-cpu-strata-" in ln for ln in shown.splitlines()) == lines_of_strata, shown
    finally:
        runner.stop()
        Path(f"{gate}.end").touch()  # its job ends: a stopped runner leaves its jobs running


def test_a_lane_without_a_blocker_shows_none(tmp_path: Path, queue_root: Path) -> None:
    runner = RunnerProcess(queue_root).start()
    try:
        assert plan_cli("park", str(queue_root), "--reason", "reboot")[0] == 0
        write_job(queue_root, "1-gpu.job", "# LANE=gpu\ntrue\n")
        wait_for(lambda: runner.status()["lanes"]["gpu"].get("reason") == "parked")
        out = plan_cli("status", str(queue_root))[1]
        assert "  gpu   waiting (parked)" in out and ": )" not in out
    finally:
        runner.stop()


def test_bootstrap_start_runs_the_runner_detached_once_and_status_says_how(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "box"
    hosts = sshd.hosts_file(root)
    args = ["bootstrap", "testbox", "--hosts", str(hosts), "--user", "--python", sys.executable, "--start"]
    code, out = plan_cli(*args, "--no-cgroup", "--tick", "0.5")
    assert code == 0, out
    assert "  started the runner detached: pid " in out and "runner is ticking" in out
    pid = int(out.split("detached: pid ", 1)[1].split(",", 1)[0])
    try:
        assert f"--root {root} --tick 0.5" in out and str(root / ".plan-runner/runner.log") in out
        assert os.getsid(pid) == pid  # its own session: the ssh session that started it has ended
        code, out = plan_cli("status", "testbox", "--hosts", str(hosts))
        assert code == 0 and f"runner pid {pid}" in out
        assert "started: plan bootstrap --start by " in out
        code, out = plan_cli(*args, "--no-cgroup")
        assert code == 0, out
        assert f"a runner already serves {root} (pid {pid}, started plan bootstrap --start by " in out
        assert "started the runner" not in out
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 20)
    assert "runner-stop" in (root / "events.jsonl").read_text()


def test_the_agent_groups_a_large_backlog_and_plan_status_shows_what_the_whole_list_shows(tmp_path: Path) -> None:
    """`plan status` asks the agent to group the waiting jobs (issue 33): the answer carries the groups and each
    lane's first jobs, not 10 000 entries, and the screen is the one the whole list makes."""
    import json
    import time

    from runner.agent import handlers
    from runner.estimates import PER_LANE
    from runner.views.status import render_status

    now = time.time()
    queued = [
        {
            "job": f"j-{i:05d}.job",
            "lane": "cpu",
            "reason": "order",
            "since": now - 60,
            "detail": "j-a is ahead of it",
            "blocker": "j-a.job",
        }
        for i in range(2000)
    ]
    queued += [
        {
            "job": f"g-{i:03d}.job",
            "lane": "gpu",
            "reason": "requires",
            "since": now - i,
            "detail": f"test -f /m/{i}",
            "blocker": f"test -f /m/{i}",
        }
        for i in range(300)
    ]
    status = {"runner": {"pid": 1, "heartbeat": now, "instance": "x"}, "lanes": {}, "running": [], "queued": queued}
    (tmp_path / "status.json").write_text(json.dumps(status))
    whole = handlers.status(str(tmp_path), {"offset": -1, "estimates": True})
    grouped = handlers.status(str(tmp_path), {"offset": -1, "estimates": True, "grouped": True})
    assert len(whole["status"]["queued"]) == 2300 and grouped["status"]["waiting_count"] == 2300
    assert len(grouped["status"]["queued"]) == 2 * PER_LANE and len(json.dumps(grouped)) < len(json.dumps(whole)) / 10
    # the estimated starts read each lane's first jobs only (each answer's times are its own clock's)
    basis = {job: e["basis"] for job, e in grouped["estimates"]["queued"].items()}
    assert basis == {job: e["basis"] for job, e in whole["estimates"]["queued"].items()} and len(basis) == 2 * PER_LANE
    shown = render_status(grouped["status"], now, estimates=grouped["estimates"])
    assert shown == render_status(whole["status"], now, estimates=grouped["estimates"])
    assert "waiting (2300):" in shown and "  order       2000 jobs  on j-a.job  oldest j-00000.job" in shown
