"""What the Slurm tests share: a plan written, a job's attempts and end read from the ledger, a root's jobs cancelled."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import wait_for
from tests.slurm.cluster import Slurm


def write_plan(path: Path, name: str, jobs: str) -> Path:
    path.write_text(f"plan: {name}\njobs:\n" + jobs)
    return path


def second_try_writes(tmp_path: Path, name: str, first: str) -> str:
    """A plan job NAME (2 attempts) whose first attempt runs FIRST (which must fail it: end with `exit 1`, be
    killed, ...) and whose second writes NAME.out, its output."""
    count, out = tmp_path / f"{name}.count", tmp_path / f"{name}.out"
    body = (
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}; "
        f"if [ $n -lt 2 ]; then {first}; fi; touch {out}"
    )
    return f"  - name: {name}\n    retries: 2\n    run: \"{body}\"\n    outputs: ['{out}']\n"


def ledger(root: Path) -> dict[str, Any]:
    return json.loads((root / "slurm.json").read_text())


def attempts(root: Path, plan_name: str, job: str) -> list[dict[str, Any]]:
    try:
        return ledger(root)["plans"][plan_name]["jobs"][job]["attempts"]
    except (OSError, KeyError, ValueError):
        return []


def known_ids(slurm: Slurm) -> set[str]:
    return {j["id"] for j in slurm.squeue()}


def cancel_root(slurm: Slurm, root: Path) -> None:
    """scancel every job the root's ledger knows that its wrapper has not recorded the end of (one call). A job
    whose wrapper wrote its result may still be running (exiting): cancelled then, Slurm would call it CANCELLED."""
    try:
        plans = ledger(root)["plans"]
    except (OSError, ValueError):
        return
    ids = [
        str(a["id"])
        for name, p in plans.items()
        for job, r in p["jobs"].items()
        for a in r["attempts"]
        if not (root / "results" / name / job / f"{a['id']}.json").exists()
    ]
    if ids:
        subprocess.run(["scancel", *ids], env=slurm.env, capture_output=True)


def held_until(gate: Path) -> str:
    """A job body that runs until the test creates GATE: it holds its slot for as long as the test looks, and not
    a fixed sleep longer (cancel_root ends it if the test fails first)."""
    return f"until [ -e {gate} ]; do sleep 0.05; done"


def ended(root: Path, plan_name: str, job: str) -> str | None:
    """The state the job's wrapper recorded for its last attempt (its result file), if it has ended."""
    found = attempts(root, plan_name, job)
    if not found:
        return None
    result = root / "results" / plan_name / job / f"{found[-1]['id']}.json"
    return json.loads(result.read_text())["state"] if result.exists() else None


def time_limit(slurm: Slurm, job_id: int) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", str(job_id)], capture_output=True, text=True, env=slurm.env, check=True
    ).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("TimeLimit="))


def job_processes(job_id: int | str) -> list[int]:
    """The processes still running a Slurm job's batch script here (by the SLURM_JOB_ID in their environment)."""
    mark = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append(int(entry))
    return found


def settle(slurm: Slurm, root: Path) -> None:
    """End every job of the root's ledger Slurm still runs, a timed-out one its wrapper holds until Slurm's
    time-limit pass among them (runner.slurm.attempt.end_as_timeout), and wait until none is running or
    completing: a node with a completing job takes no new one, and the next test's jobs would read Resources."""
    try:
        ids = {str(a["id"]) for p in ledger(root)["plans"].values() for r in p["jobs"].values() for a in r["attempts"]}
    except (OSError, ValueError):
        return
    busy = ("PENDING", "RUNNING", "COMPLETING")
    live = [j["id"] for j in slurm.squeue() if j["id"] in ids and j["state"] in busy]
    if live:
        subprocess.run(["scancel", *live], env=slurm.env, capture_output=True)
    wait_for(lambda: not [j for j in slurm.squeue() if j["id"] in ids and j["state"] in busy], 60, 0.1)
