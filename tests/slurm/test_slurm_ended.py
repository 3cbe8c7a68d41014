"""Attempts that Slurm ends, on a real cluster with accounting and memory limits (task/cgroup): a plan `timeout:`
is a TIMEOUT in sacct, a job over its memory is OUT_OF_MEMORY, a job at Slurm's time limit is TIMEOUT, and each
is retried with its cause named in the `retry` event and in status."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm
from tests.slurm.jobs import attempts, cancel_root, ended, second_try_writes, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


@pytest.fixture(scope="module")
def enforced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """Memory is a consumable here: each job gets 100 MB unless its lane says otherwise (DefMemPerCPU), enforced
    by its cgroup."""
    cluster = start_slurm(
        tmp_path_factory.mktemp("limited"), accounting=True, memory=True, settings={"DefMemPerCPU": 100}
    )
    yield cluster
    stop_slurm(cluster)


def _sacct(slurm: Slurm, ids: list[str]) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-P", "-n", "-X", "--format=JobID,State", "-j", ",".join(ids)],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout
    return dict(line.split("|")[:2] for line in out.splitlines())


def _status(hosts: Path) -> dict:
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
    assert code == 0, out
    return json.loads(out)


def _waiting_after(hosts: Path, job: str) -> dict | None:
    """Status's queue by job once JOB waits for a next try (each status is a contact that submits what is due)."""
    waiting = {q["job"]: q for q in _status(hosts)["status"]["queued"]}
    return waiting if "backoff" in waiting.get(job, {}).get("detail", "") else None


def test_timeouts_and_memory_limits_end_as_slurm_says_and_are_retried_with_their_cause(
    tmp_path: Path, enforced: Slurm
) -> None:
    """`slow` outlives its plan timeout (1 s), `hog` its lane's 60 MB, `long` the time limit Slurm is told (as it
    would reach a lane's `time:`; lowered here by `scontrol update`, as an admin may, so the test waits
    Slurm's 30 s time-limit pass, not a minute)."""
    root, started = tmp_path / "submit", tmp_path / "long.started"
    hog = "python3 -c 'b = [bytearray(1 << 20) for _ in range(400)]'"
    jobs = (
        second_try_writes(tmp_path, "slow", "echo slow-body-line; sleep 60; exit 1").replace(
            "retries", "timeout: 1s\n    retries"
        )
        + second_try_writes(tmp_path, "hog", f"echo hog-body-line; {hog}; exit 1").replace(
            "run:", "lane: net\n    run:"
        )
        + second_try_writes(tmp_path, "long", f"touch {started}; sleep 120; exit 1")
    )
    p = write_plan(tmp_path / "se.yaml", "se", jobs)
    hosts = enforced.hosts_file(root, extra="    backoff_base: 10\n    lanes:\n      net: {mem: 60M}\n")
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, out
    first = {name: str(attempts(root, "se", name)[0]["id"]) for name in ("slow", "hog", "long")}
    try:
        wait_for(started.exists, 60, 0.1)
        subprocess.run(["scontrol", "update", f"JobId={first['long']}", "TimeLimit=0"], env=enforced.env, check=True)
        # the wrapper's own timer, and the kernel's OOM killer in the job's cgroup: each wrapper writes its
        # result and submits its next try (10 s later) itself
        wait_for(lambda: ended(root, "se", "slow") == "TIMEOUT" and ended(root, "se", "hog") == "OUT_OF_MEMORY", 60)
        waiting = {q["job"]: q for q in _status(hosts)["status"]["queued"]}
        assert waiting["se/slow.job"]["detail"] == "attempt 2 waits out the retry backoff after TIMEOUT", waiting
        assert waiting["se/hog.job"]["detail"] == "attempt 2 waits out the retry backoff after OUT_OF_MEMORY"
        # Slurm ends the timed-out job itself at its next time-limit pass, and `long` at its lowered limit
        wait_for(lambda: set(_sacct(enforced, list(first.values())).values()) == {"TIMEOUT", "OUT_OF_MEMORY"}, 60, 1)
        states = _sacct(enforced, list(first.values()))
        assert [states[first[n]] for n in ("slow", "hog", "long")] == ["TIMEOUT", "OUT_OF_MEMORY", "TIMEOUT"], states
        # `long`'s wrapper died with its job: the next contact (this status) retries it
        waiting = wait_for(lambda: _waiting_after(hosts, "se/long.job"), 30, 0.5)
        assert waiting["se/long.job"]["detail"] == "attempt 2 waits out the retry backoff after TIMEOUT", waiting
        wait_for(lambda: all(ended(root, "se", n) == "COMPLETED" for n in ("slow", "hog", "long")), 90, 0.5)
        events = _status(hosts)["events"]
    finally:
        cancel_root(enforced, root)
    retries = {e["job"]: e for e in events if e["event"] == "retry"}
    assert {job: e["cause"] for job, e in retries.items()} == {
        "se/slow.job": "TIMEOUT",
        "se/hog.job": "OUT_OF_MEMORY",
        "se/long.job": "TIMEOUT",
    }, retries
    # the body's own last lines, never the wrapper's (the failure cluster's label)
    assert retries["se/slow.job"]["tail"] == ["slow-body-line"], retries
    assert retries["se/hog.job"]["tail"][0] == "hog-body-line", retries
    for name in ("slow", "hog", "long"):
        assert (tmp_path / f"{name}.out").exists()
