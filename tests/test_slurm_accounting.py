"""The sacct path against real accounting (slurmdbd over a private mariadb): what squeue forgot and no wrapper
recorded comes from sacct, by ledger id, with or without AccountingStoreFlags=job_comment."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.conftest import plan_cli, wait_for
from tests.slurm import Slurm, start_slurm, stop_slurm
from tests.test_slurm_ledger import attempts, cancel_root, ended, known_ids, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


@pytest.fixture
def accounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Slurm]]:
    """accounted(job_comment=False): a cluster of the test's own with accounting on (Slurm's default flags have
    no job_comment), which forgets finished jobs in ~10 s. One each: the two tests run at once, on two workers."""
    made: list[Slurm] = []

    def start(job_comment: bool = False) -> Slurm:
        made.append(
            start_slurm(tmp_path_factory.mktemp("acct"), min_job_age=2, accounting=True, job_comment=job_comment)
        )
        return made[-1]

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


def run_and_forget(tmp_path: Path, slurm: Slurm, name: str) -> tuple[Path, Path, int]:
    """Push plan NAME (`ok` runs, `killed` is scancelled while it runs, so no wrapper records its end), then
    wait until squeue has forgotten both. (root, hosts file, the killed job's id)"""
    root = tmp_path / "submit"
    p = write_plan(
        tmp_path / f"{name}.yaml", name, "  - name: ok\n    run: 'true'\n  - name: killed\n    run: sleep 60\n"
    )
    hosts = slurm.hosts_file(root)
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        killed = attempts(root, name, "killed")[0]["id"]
        wait_for(lambda: any(j["id"] == str(killed) and j["state"] == "RUNNING" for j in slurm.squeue()), 60, 0.2)
        subprocess.run(["scancel", str(killed)], env=slurm.env, check=True)
        wait_for(lambda: ended(root, name, "ok") == "COMPLETED", 60, 0.2)
        ids = {str(a["id"]) for job in ("ok", "killed") for a in attempts(root, name, job)}
        wait_for(lambda: not ids & known_ids(slurm), 60, 0.5)
    finally:
        cancel_root(slurm, root)
    return root, hosts, killed


def check_from_sacct(tmp_path: Path, root: Path, hosts: Path, name: str, killed: int) -> None:
    code, out = plan("push", "cluster", str(tmp_path / f"{name}.yaml"), "--hosts", str(hosts), "--dry-run")
    assert code == 0 and re.search(r"  d  ok\.job", out), out
    # no wrapper recorded its end and squeue forgot it: only sacct knows, and says so
    assert f"  !  killed.job  (CANCELLED as {killed}; not resubmitted without --retry-failed)" in out, out
    result = CliRunner().invoke(app, ["report", "cluster", "--hosts", str(hosts), "--plan", name, "--json"])
    assert result.exit_code == 0 and "accounting off" not in result.output, result.output
    jobs = json.loads(result.stdout)["jobs"]
    assert jobs[f"{name}/ok.job"]["outcome"] == "done"
    assert jobs[f"{name}/killed.job"]["outcome"] == "cancelled" and jobs[f"{name}/killed.job"]["attempts"] == 1


def test_sacct_answers_for_what_squeue_forgot_without_job_comment(
    tmp_path: Path, accounted: Callable[..., Slurm]
) -> None:
    cluster = accounted()
    root, hosts, killed = run_and_forget(tmp_path, cluster, "ac")
    assert sacct_comment(cluster, killed) == ""  # Slurm's default: sacct has no comment to find a plan by
    check_from_sacct(tmp_path, root, hosts, "ac", killed)


def test_sacct_with_job_comment_gives_the_same_answers(tmp_path: Path, accounted: Callable[..., Slurm]) -> None:
    cluster = accounted(job_comment=True)
    assert "AccountingStoreFlags=job_comment" in cluster.conf.read_text()
    root, hosts, killed = run_and_forget(tmp_path, cluster, "ad")
    assert sacct_comment(cluster, killed).startswith("plan=ad@")
    check_from_sacct(tmp_path, root, hosts, "ad", killed)
