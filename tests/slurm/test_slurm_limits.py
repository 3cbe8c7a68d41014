"""All-or-nothing Slurm pushes on a real cluster with limits (MaxArraySize, MaxJobCount, the user's MaxSubmitJobs):
arrays cut to fit, a push that cannot fit refused before anything is submitted, and a submission that fails part
way withdrawn whole, each with Slurm's own words and exit 1."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm
from tests.slurm.jobs import attempts, cancel_root, held_until, ledger, write_plan

# Every test here on one worker: one cluster with accounting (mariadb, slurmdbd: ~1 s of CPU to start), not one
# on each worker that runs one of them.
pytestmark = [pytest.mark.usefixtures("plan_env"), pytest.mark.xdist_group("limited")]
plan = plan_cli


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """One cluster with accounting for every test here: MaxArraySize=100, MaxJobCount=350, MaxSubmitJobs=330."""
    cluster = start_slurm(
        tmp_path_factory.mktemp("limited"),
        accounting=True,
        settings={"MaxArraySize": 100, "MaxJobCount": 350, "MaxSubmitJobs": 330},
    )
    yield cluster
    stop_slurm(cluster)


def plan_jobs(slurm: Slurm, name: str) -> list[dict[str, str]]:
    """This plan's jobs as squeue shows them, one row per array element (squeue -r)."""
    return [j for j in slurm.squeue(expand=True) if j["name"].startswith(f"{name}/")]


def test_arrays_are_cut_to_max_array_size_and_a_push_past_the_limits_is_refused_whole(
    tmp_path: Path, limited: Slurm
) -> None:
    slurm, root, gate = limited, tmp_path / "submit", tmp_path / "gate"
    wide = write_plan(
        tmp_path / "wide.yaml",
        "wide",
        f"  - name: hold\n    run: {held_until(gate)}; touch {tmp_path}/held\n    outputs: ['{tmp_path}/held']\n"
        "  - name: 'e{{ i }}'\n    foreach: {i: " + json.dumps(list(range(300))) + "}\n"
        "    requires: [{after: hold}]\n    run: 'true'\n",
    )
    hosts = slurm.hosts_file(root)
    try:
        code, out = plan("push", "cluster", str(wide), "--hosts", str(hosts))
        assert code == 0 and "pushed: 301 submitted" in out, out
        shown = plan_jobs(slurm, "wide")
        elements = [j for j in shown if j["name"] != "wide/hold"]
        assert len(elements) == 300 and len({j["id"] for j in elements}) == 300
        arrays = {j["id"].split("_")[0] for j in elements}
        assert len(arrays) == 4 and all(int(j["id"].split("_")[1]) < 100 for j in elements), arrays
        # 301 records now; 60 more are past MaxJobCount (350) and MaxSubmitJobs (330): refused before any sbatch
        more = write_plan(
            tmp_path / "more.yaml", "more", "".join(f"  - name: m{i}\n    run: 'true'\n" for i in range(60))
        )
        code, out = plan("push", "cluster", str(more), "--hosts", str(hosts), "--json")
        assert code == 1, out
        answer, _ = json.JSONDecoder().raw_decode(out[out.index("{") :])  # stderr follows it
        error = " ".join(answer["errors"])
        assert "this push would submit 60 jobs" in error and "Nothing was submitted" in error, error
        assert "MaxJobCount=350: slurmctld holds 301 job records" in error and "49 more fit" in error, error
        assert "MaxSubmitJobs=330 (sacctmgr, user " in error and "301 of your jobs" in error, error
        assert plan_jobs(slurm, "more") == [] and "more" not in ledger(root)["plans"]
    finally:
        cancel_root(slurm, root)


def test_a_submission_failing_part_way_withdraws_what_the_push_submitted(tmp_path: Path, limited: Slurm) -> None:
    """The second level asks for more GPUs than the node has: sbatch refuses it after the first level went in;
    that level is cancelled, the ledger stays as it was, and Slurm's own words say why."""
    slurm, root = limited, tmp_path / "submit"
    p = write_plan(
        tmp_path / "half.yaml",
        "half",
        f"  - name: first\n    run: sleep 30; touch {tmp_path}/f\n    outputs: ['{tmp_path}/f']\n"
        "  - name: also\n    run: sleep 30\n"
        "  - name: second\n    lane: gpu\n    run: 'true'\n    requires: [{after: first}]\n",
    )
    hosts = slurm.hosts_file(root, extra="    lanes:\n      gpu: {gres: 'gpu:9'}\n")
    try:
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 1, out
        assert "sbatch for half/second failed: sbatch: error: Batch job submission failed: " in out, out
        assert "all or nothing: the 2 jobs this push had submitted were cancelled" in out, out
        assert "stopped answering" not in out and "pushed: 0 submitted" in out, out
        ids = re.search(r"were cancelled \((\d+) (\d+)\)", out)
        assert ids, out
        # nothing of the push waits or runs: what it submitted is cancelled (the refused sbatch left a record of
        # its own, FAILED BadConstraints, Slurm's doing)
        wait_for(lambda: all(j["state"] in ("CANCELLED", "FAILED") for j in plan_jobs(slurm, "half")), 30, 0.2)
        states = {j["id"]: j["state"] for j in plan_jobs(slurm, "half")}
        assert [states[i] for i in ids.groups()] == ["CANCELLED", "CANCELLED"], states
        assert not (root / "slurm.json").exists() or "half" not in ledger(root)["plans"]
        assert attempts(root, "half", "first") == []
    finally:
        cancel_root(slurm, root)
