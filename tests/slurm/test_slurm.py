"""The Slurm backend against a real single-node cluster on 127.0.0.1 started by the fixture."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.conftest import REPO, plan_cli, wait_for
from tests.slurm.cluster import Slurm
from tests.slurm.jobs import ended, settle

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


def jobs_of(slurm: Slurm, plan_name: str) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for job in slurm.squeue():
        if job["comment"].startswith(f"plan={plan_name}@"):
            name = job["name"].removeprefix(f"{plan_name}/")
            if name not in found or int(found[name]["id"]) < int(job["id"]):
                found[name] = dict(job, name=name)
    return found


def cancel_plan(slurm: Slurm, plan_name: str) -> None:
    ids = [j["id"] for j in jobs_of(slurm, plan_name).values() if j["state"] in ("PENDING", "RUNNING")]
    if ids:
        subprocess.run(["scancel", *ids], env=slurm.env, capture_output=True)


def write_plan(path: Path, name: str, jobs: str) -> Path:
    path.write_text(f"plan: {name}\njobs:\n" + jobs)
    return path


def test_demo_plan_runs_to_completion_in_dependency_order(tmp_path: Path, slurm: Slurm) -> None:
    hosts = slurm.hosts_file(tmp_path / "submit")
    work = tmp_path / "work"
    code, out = plan("push", "cluster", str(REPO / "plans/demo.yaml"), "--hosts", str(hosts), "--set", f"work={work}")
    assert code == 0, out
    assert "6 new" in out and out.count("submitted ") == 6
    try:
        wait_for(
            lambda: (
                all(j["state"] == "COMPLETED" for j in jobs_of(slurm, "demo").values())
                and len(jobs_of(slurm, "demo")) == 6
            ),
            120,
            0.2,
        )
    finally:
        cancel_plan(slurm, "demo")
    assert (work / "bench.jsonl").read_text().count("\n") == 2
    logs = tmp_path / "submit" / "logs" / "demo"

    def first_start(job: str) -> float:
        line = next(ln for ln in (logs / f"{job}.job.log").read_text().splitlines() if ln.startswith("=== "))
        return time.mktime(time.strptime(" ".join(line.split()[1:3]), "%Y-%m-%d %H:%M:%S"))

    def finished(job: str) -> float:
        return (logs / f"{job}.job.log").stat().st_mtime

    assert first_start("30-gpu-intake-tiny-a") >= int(finished("10-net-fetch-tiny-a")) - 1
    assert first_start("40-gpu-bench") >= int(finished("30-gpu-intake-tiny-b")) - 1
    code, out = plan("push", "cluster", str(REPO / "plans/demo.yaml"), "--hosts", str(hosts), "--set", f"work={work}")
    assert code == 0 and re.findall(r"submitted (\S+) as", out) == [] and "6 done" in out  # nothing again


def test_gres_serialises_gpu_and_license_makes_net_gpu_exclusive(tmp_path: Path, slurm: Slurm) -> None:
    spans = tmp_path / "spans"
    # half a second each: two jobs let through at once start in the same scheduling pass and overlap
    body = 'echo "start LANE $(date +%s.%N)" >> SPANS; sleep 0.5; echo "end LANE $(date +%s.%N)" >> SPANS'
    jobs = "".join(
        f"  - name: {name}\n    lane: {lane}\n    run: {json.dumps(body.replace('LANE', lane).replace('SPANS', str(spans)))}\n"
        for name, lane in (("g1", "gpu"), ("g2", "gpu"), ("n1", "net"))
    )
    p = write_plan(tmp_path / "ex.yaml", "ex", jobs)
    hosts = slurm.hosts_file(tmp_path / "submit")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        wait_for(lambda: spans.exists() and spans.read_text().count("end") == 3, 90, 0.2)
        seen_reasons = {j["reason"] for j in jobs_of(slurm, "ex").values()}
    finally:
        cancel_plan(slurm, "ex")
    events = sorted((float(t), kind, lane) for kind, lane, t in (ln.split() for ln in spans.read_text().splitlines()))
    running = 0
    for _, kind, _ in events:
        running += 1 if kind == "start" else -1
        assert running <= 1, "two of net/gpu ran at once"
    assert seen_reasons <= {"None", "Resources", "Licenses", "Priority"}


def test_failed_producer_blocks_its_consumer_and_watch_says_blocked(tmp_path: Path, slurm: Slurm) -> None:
    out_file = tmp_path / "model.gguf"
    jobs = (
        f"  - name: 10-fetch\n    lane: cpu\n    run: \"echo 'HTTP 404'; exit 22\"\n    outputs: ['{out_file}']\n"
        f"  - name: 20-intake\n    lane: cpu\n    run: echo intake\n    requires: ['{out_file}']\n"
    )
    p = write_plan(tmp_path / "bl.yaml", "bl", jobs)
    hosts = slurm.hosts_file(tmp_path / "submit")
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, out
    state = tmp_path / "w.json"
    try:
        wait_for(lambda: jobs_of(slurm, "bl").get("20-intake", {}).get("reason") == "DependencyNeverSatisfied", 60, 0.2)
        code, out = plan("watch", "cluster", "--hosts", str(hosts), "--once", "--state", str(state), "--idle", "3600")
        assert code == 13 and "BLOCKED: bl/20-intake.job can never run: its producer 10-fetch failed" in out
        code, out = plan("status", "cluster", "--hosts", str(hosts))
        assert code == 0 and "blocked" in out and "10-fetch" in out
        # failed jobs are held: a re-push does not resubmit them without --retry-failed
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
        assert "  !  10-fetch.job" in out
    finally:
        cancel_plan(slurm, "bl")


def test_timeout_is_enforced(tmp_path: Path, slurm: Slurm) -> None:
    jobs = "  - name: slow\n    lane: cpu\n    run: sleep 120\n    timeout: 1s\n"
    p = write_plan(tmp_path / "to.yaml", "to", jobs)
    hosts = slurm.hosts_file(tmp_path / "submit")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        # the wrapper's own timer ended it; Slurm then ends the job as TIMEOUT (tests/slurm/test_slurm_ended.py)
        wait_for(lambda: ended(tmp_path / "submit", "to", "slow") == "TIMEOUT", 60, 0.2)
    finally:
        settle(slurm, tmp_path / "submit")
    assert "=== TIMEOUT: slow ended after 1s" in (tmp_path / "submit/logs/to/slow.job.log").read_text()
    status = cli.invoke(app, ["status", "cluster", "--hosts", str(hosts), "--json"]).stdout
    assert any(e["event"] == "timeout" and e["job"] == "to/slow.job" for e in json.loads(status)["events"])


def test_repush_resubmits_only_the_changed_job_and_dry_run_submits_nothing(tmp_path: Path, slurm: Slurm) -> None:
    gate = tmp_path / "gate"
    jobs = (
        f"  - name: a-long\n    lane: gpu\n    run: sleep 60; touch {gate}\n    outputs: ['{gate}']\n"
        f"  - name: b\n    lane: cpu\n    run: echo b\n    requires: [{{after: a-long}}]\n"
        f"  - name: c\n    lane: cpu\n    run: echo c\n    requires: [{{after: a-long}}]\n"
    )
    p = write_plan(tmp_path / "rp.yaml", "rp", jobs)
    hosts = slurm.hosts_file(tmp_path / "submit")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        before = jobs_of(slurm, "rp")
        assert before["b"]["state"] == "PENDING" and before["b"]["reason"] == "Dependency"
        p.write_text(p.read_text().replace("echo c", "echo c2"))
        count = len(slurm.squeue())
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
        assert code == 0 and "  ~  c.job" in out and len(slurm.squeue()) == count
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and re.findall(r"submitted (\S+) as", out) == ["c.job"]
        after = jobs_of(slurm, "rp")
        assert after["b"]["id"] == before["b"]["id"] and after["a-long"]["id"] == before["a-long"]["id"]
        assert after["c"]["id"] != before["c"]["id"]
        assert f"afterok:{before['a-long']['id']}" in after["c"]["dependency"]
        code, out = plan("status", "cluster", "--hosts", str(hosts))
        assert "requires" in out and "b.job" in out
    finally:
        cancel_plan(slurm, "rp")


def test_report_on_a_cluster_without_accounting_says_so(tmp_path: Path, slurm: Slurm) -> None:
    hosts = slurm.hosts_file(tmp_path / "submit")
    (tmp_path / "submit").mkdir()
    result = cli.invoke(app, ["report", "cluster", "--hosts", str(hosts), "--json"])
    assert result.exit_code == 0, result.output
    assert result.output.count("accounting off (") == 1


def test_push_to_a_cluster_through_its_login_node_over_ssh(tmp_path: Path, slurm: Slurm, sshd) -> None:
    import sys

    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  login:\n    backend: slurm\n    ssh: testbox\n    root: {tmp_path / 'submit'}\n"
        f"    slurm_conf: {slurm.conf}\n    python: {sys.executable}\n"
        f"    ssh_options: [-F, {sshd.config}]\n"
    )
    marker = tmp_path / "made-by-slurm"
    p = write_plan(
        tmp_path / "ssh.yaml",
        "viassh",
        f"  - name: touch\n    lane: cpu\n    run: touch {marker}\n    outputs: ['{marker}']\n",
    )
    code, out = plan("push", "login", str(p), "--hosts", str(hosts))
    assert code == 0 and "submitted touch.job as" in out, out
    try:
        wait_for(lambda: jobs_of(slurm, "viassh").get("touch", {}).get("state") == "COMPLETED", 60, 0.2)
    finally:
        cancel_plan(slurm, "viassh")
    assert marker.exists()
    code, out = plan("status", "login", "--hosts", str(hosts))
    assert code == 0 and out.startswith("Slurm (squeue, read")
