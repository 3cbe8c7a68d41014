"""The sacct path against real accounting (slurmdbd over a private mariadb): what squeue forgot and no wrapper
recorded comes from sacct, by ledger id, with or without AccountingStoreFlags=job_comment."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm
from tests.slurm.jobs import attempts, cancel_root, ended, known_ids, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


@pytest.fixture
def accounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., list[Slurm]]]:
    """accounted(*job_comment): a cluster of the test's own per flag, started at once, with accounting on (Slurm's
    default flags have no job_comment; True adds AccountingStoreFlags=job_comment), each forgetting finished jobs
    at its controller's first purge, 10 s after it started (MinJobAge=2; slurmctld purges every 10 s at most)."""
    made: list[Slurm] = []

    def start_one(job_comment: bool) -> Slurm:
        cluster = start_slurm(tmp_path_factory.mktemp("acct"), min_job_age=2, accounting=True, job_comment=job_comment)
        made.append(cluster)
        return cluster

    def start(*job_comment: bool) -> list[Slurm]:
        with ThreadPoolExecutor(len(job_comment)) as pool:
            return list(pool.map(start_one, job_comment))

    yield start
    for cluster in made:
        stop_slurm(cluster)


def sacct_comment(slurm: Slurm, job_id: int) -> str:
    out = subprocess.run(
        ["sacct", "-P", "-n", "-X", "--format=JobID,Comment", "-j", str(job_id)],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout
    return out.strip().split("|", 1)[1]


def running(slurm: Slurm, job_id: int) -> bool:
    return any(j["id"] == str(job_id) and j["state"] == "RUNNING" for j in slurm.squeue())


@dataclass
class PlanRun:
    """Plan NAME pushed to CLUSTER from ROOT: `ok` ran, `killed` was scancelled while it ran, and so was element
    1 of the array e0..e3 (ELEMENT), whose other elements ran."""

    name: str
    cluster: Slurm
    root: Path
    hosts: Path
    killed: int
    element: str
    ids: set[str]


def run_and_kill(tmp_path: Path, plans: dict[str, Slurm]) -> list[PlanRun]:
    """Push each plan NAME to its cluster (`ok` runs, `killed` is scancelled while it runs, so no wrapper records
    its end), the plans side by side, and wait until their jobs have ended."""
    runs: list[PlanRun] = []
    try:
        for name, slurm in plans.items():
            root = tmp_path / name / "submit"  # its hosts file beside it, one per cluster
            root.parent.mkdir()
            p = write_plan(
                tmp_path / f"{name}.yaml",
                name,
                "  - name: ok\n    run: 'true'\n  - name: killed\n    run: sleep 60\n"
                "  - name: 'e{{ i }}'\n    foreach: {i: [0, 1, 2, 3]}\n    run: 'n={{ i }}; [ \"$n\" != 1 ] || sleep 60'\n",
            )
            hosts = slurm.hosts_file(root)
            assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
            killed, element = attempts(root, name, "killed")[0]["id"], attempts(root, name, "e1")[0]["id"]
            runs.append(PlanRun(name, slurm, root, hosts, killed, element, set()))
        for run in runs:
            for job_id in (run.killed, run.element):
                wait_for(lambda run=run, job_id=job_id: running(run.cluster, job_id), 60, 0.2)
                subprocess.run(["scancel", str(job_id)], env=run.cluster.env, check=True)
        done = ("ok", "e0", "e2", "e3")
        for run in runs:
            wait_for(lambda run=run: all(ended(run.root, run.name, job) == "COMPLETED" for job in done), 60, 0.2)
            run.ids.update(str(a["id"]) for job in (*done, "killed", "e1") for a in attempts(run.root, run.name, job))
    except BaseException:
        for run in runs:
            cancel_root(run.cluster, run.root)
        raise
    return runs


def check_from_sacct(tmp_path: Path, run: PlanRun) -> None:
    name, hosts, killed = run.name, run.hosts, run.killed
    code, out = plan("push", "cluster", str(tmp_path / f"{name}.yaml"), "--hosts", str(hosts), "--dry-run")
    assert code == 0 and re.search(r"  d  ok\.job", out), out
    # no wrapper recorded its end and squeue forgot it: only sacct knows, and says so
    assert f"  !  killed.job  (CANCELLED as {killed}; not resubmitted without --retry-failed)" in out, out
    result = CliRunner().invoke(app, ["report", "cluster", "--hosts", str(hosts), "--plan", name, "--json"])
    assert result.exit_code == 0 and "accounting off" not in result.output, result.output
    jobs = json.loads(result.stdout)["jobs"]
    assert jobs[f"{name}/ok.job"]["outcome"] == "done"
    assert jobs[f"{name}/killed.job"]["outcome"] == "cancelled" and jobs[f"{name}/killed.job"]["attempts"] == 1
    # the ledger lost: sacct accounts for the job and for the array element no wrapper recorded (by the array's
    # members file: named in the comment where accounting stores it, else found by the array's name)
    (run.root / "slurm.json").unlink()
    (run.root / "slurm.json.1").unlink(missing_ok=True)
    code, out = plan("push", "cluster", str(tmp_path / f"{name}.yaml"), "--hosts", str(hosts), "--dry-run")
    assert code == 0 and "rebuilt under the push lock from squeue, the results directory, sacct" in out, out
    assert f"  !  killed.job  (CANCELLED as {killed}; not resubmitted" in out, out
    assert f"  !  e1.job  (CANCELLED as {run.element}; not resubmitted" in out, out
    assert re.search(r"  d  e3\.job  \(completed as \d+_3\)", out), out


def test_sacct_answers_for_what_squeue_forgot_without_and_with_job_comment(
    tmp_path: Path, accounted: Callable[..., list[Slurm]]
) -> None:
    """One scenario on two clusters at once, Slurm's default flags and AccountingStoreFlags=job_comment: their
    jobs end together and are forgotten at the same purge, so the test waits for one, not two."""
    plain, commented = accounted(False, True)
    assert "AccountingStoreFlags" not in plain.conf.read_text()
    assert "AccountingStoreFlags=job_comment" in commented.conf.read_text()
    runs = run_and_kill(tmp_path, {"ac": plain, "ad": commented})
    try:
        for run in runs:  # squeue has forgotten both jobs of both plans
            wait_for(lambda run=run: not run.ids & known_ids(run.cluster), 60, 0.2)
    finally:
        for run in runs:
            cancel_root(run.cluster, run.root)
    assert sacct_comment(plain, runs[0].killed) == ""  # Slurm's default: sacct has no comment to find a plan by
    check_from_sacct(tmp_path, runs[0])
    assert sacct_comment(commented, runs[1].killed).startswith("plan=ad@")  # the same answers with one
    check_from_sacct(tmp_path, runs[1])
