"""`plan status` and `plan report` on Slurm, from Slurm's own clocks and the ledger, on a real cluster."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from runner.agent import dispatch
from runner.slurm.statusitems import SlurmStatus, parse_status_answer
from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm
from tests.slurm.jobs import attempts, cancel_root, ended, held_until, settle, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


def status(hosts: Path) -> dict:
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
    assert code == 0, out
    return json.loads(out)


def scontrol_time(slurm: Slurm, job_id: int, field: str) -> float:
    out = subprocess.run(
        ["scontrol", "show", "job", str(job_id)], capture_output=True, text=True, env=slurm.env, check=True
    ).stdout
    text = next(w.split("=", 1)[1] for w in out.split() if w.startswith(f"{field}="))
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def test_status_shows_running_jobs_per_lane_with_slurms_start_and_eligible_times(tmp_path: Path, slurm: Slurm) -> None:
    root, gate = tmp_path / "submit", tmp_path / "gate"
    p = write_plan(
        tmp_path / "st.yaml",
        "st",
        f"  - name: g1\n    lane: gpu\n    run: {held_until(gate)}\n"
        f"  - name: g2\n    lane: gpu\n    run: {held_until(gate)}\n  - name: quick\n    run: 'true'\n",
    )
    hosts = slurm.hosts_file(root)
    pushed = time.time()
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        running = wait_for(lambda: [r for r in status(hosts)["status"]["running"] if r["lane"] == "gpu"], 60, 0.5)
        answer = status(hosts)
        # the agent's own answer reads (runner.slurm.statusitems) into what writes it back unchanged
        raw = dispatch.answer("status", str(root), {"backend": "slurm", "slurm_conf": str(slurm.conf)})
        read = parse_status_answer(raw)
        assert isinstance(read, SlurmStatus) and read.to_json() == raw["status"] and read.running and read.queued
        first = running[0]["job"]
        other = "st/g2.job" if first == "st/g1.job" else "st/g1.job"
        assert running[0]["started"] == scontrol_time(slurm, running[0]["slurm_id"], "StartTime")
        assert answer["status"]["lanes"]["gpu"]["running"] == [first]
        waiting = next(q for q in answer["status"]["queued"] if q["job"] == other)
        assert waiting["reason"] in ("lane-busy", "exclusive", "order")  # Resources, Licenses or Priority
        assert waiting["since"] == scontrol_time(slurm, waiting["slurm_id"], "EligibleTime")
        code, text = plan("status", "cluster", "--hosts", str(hosts))
        assert f"gpu   {first}" in text, text
        gate.touch()  # the first gpu job ends only now, after the looks above; the other runs after it
        wait_for(lambda: all(ended(root, "st", j) for j in ("g1", "g2", "quick")), 60, 0.2)
    finally:
        cancel_root(slurm, root)
    result = json.loads((root / "results/st/quick" / f"{attempts(root, 'st', 'quick')[0]['id']}.json").read_text())
    time.sleep(max(0.0, result["end"] + 2 - time.time()))  # the probe comes 2 s after quick's end at least
    probe = time.time()
    events = [e for e in status(hosts)["events"] if e["job"] == "st/quick.job"]
    start = next(e for e in events if e["event"] == "start")
    done = next(e for e in events if e["event"] == "done")
    # the times the job had, not the time of the probe that noticed it
    # Slurm's StartTime when a probe saw it run, else the wrapper's own start: after the push, and not after the
    # wrapper started (a busy machine launches the batch script seconds after Slurm's StartTime)
    assert pushed - 1 <= time.mktime(time.strptime(start["ts"], "%Y-%m-%d %H:%M:%S")) <= result["start"]
    assert done["ts"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(result["end"]))
    assert time.mktime(time.strptime(done["ts"], "%Y-%m-%d %H:%M:%S")) < probe - 1


def test_report_names_outcomes_lanes_and_retries_per_plan_without_job_comment(tmp_path: Path, slurm: Slurm) -> None:
    root, count = tmp_path / "submit", tmp_path / "count"
    flaky = f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}; [ $n -ge 2 ]"
    ra = (
        f"  - name: g\n    lane: gpu\n    run: 'true'\n"
        f"  - name: t\n    run: sleep 30\n    timeout: 1s\n"
        f"  - name: f\n    run: exit 3\n    outputs: ['{tmp_path}/f.out']\n"
        f"  - name: bl\n    run: 'true'\n    requires: [{{after: f}}]\n"
        f'  - name: r\n    retries: 2\n    run: "{flaky}"\n'
        f"  - name: c\n    run: sleep 120\n"
    )
    write_plan(tmp_path / "ra.yaml", "ra", ra)
    write_plan(tmp_path / "rb.yaml", "rb", "  - name: g\n    run: 'true'\n")
    hosts = slurm.hosts_file(root, extra="    backoff_base: 1\n")
    for name in ("ra", "rb"):
        assert plan("push", "cluster", str(tmp_path / f"{name}.yaml"), "--hosts", str(hosts))[0] == 0
    try:
        wait_for(lambda: ended(root, "ra", "t") and ended(root, "ra", "f") and ended(root, "rb", "g"), 60, 0.2)
        c = attempts(root, "ra", "c")[0]["id"]
        wait_for(lambda: any(j["id"] == str(c) and j["state"] == "RUNNING" for j in slurm.squeue()), 60, 0.2)
        subprocess.run(["scancel", str(c)], env=slurm.env, check=True)
        wait_for(lambda: {j["id"]: j for j in slurm.squeue()}[str(c)]["state"] == "CANCELLED", 30, 0.2)
        status(hosts)  # folds r's first attempt, so its retry is known
        wait_for(lambda: ended(root, "ra", "r") == "COMPLETED", 60, 0.2)
    finally:
        settle(slurm, root)
    result = CliRunner().invoke(app, ["report", "cluster", "--hosts", str(hosts), "--plan", "ra", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.count("accounting off (") == 1
    report = json.loads(result.stdout)
    jobs = report["jobs"]
    assert set(jobs) == {f"ra/{j}.job" for j in ("g", "t", "f", "bl", "r", "c")}  # rb's g is not in it
    outcomes = {name: jobs[name]["outcome"] for name in jobs}
    assert outcomes == {
        "ra/g.job": "done",
        "ra/t.job": "timeout",
        "ra/f.job": "failed",
        "ra/bl.job": "blocked",
        "ra/r.job": "done",
        "ra/c.job": "cancelled",
    }
    assert jobs["ra/g.job"]["lane"] == "gpu" and jobs["ra/r.job"]["attempts"] == 2
    result = CliRunner().invoke(app, ["report", "cluster", "--hosts", str(hosts), "--plan", "nope"])
    assert result.exit_code == 1 and "no plan 'nope' was pushed here" in result.output
