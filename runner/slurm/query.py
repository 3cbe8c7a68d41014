"""The Slurm client commands a submit host runs (squeue, sacct) and their join with the ledger: which Slurm job
is which ledger attempt, and in what state, whatever squeue has forgotten."""

from __future__ import annotations

import os
import subprocess
import time

from runner.errors import ControllerDown as ControllerDown  # its home is runner/errors.py
from runner.slurm import ledger as ledger_mod
from runner.slurm.ledger import ACTIVE
from runner.slurm.records import Accounted, Attempt, JobRecord, Ledger, LiveJob

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

    from runner.slurm.jsonfields import SlurmId

    Live = Dict[SlurmId, LiveJob]  # what squeue knows, by id

SQUEUE_FIELDS = (
    "JobArrayID",
    "Name",
    "State",
    "Reason",
    "StartTime",
    "EndTime",
    "EligibleTime",
    "SubmitTime",
    "Dependency",
    "Comment",
    "JobID",
    "RestartCnt",
    "WorkDir",  # last: a path may hold anything, even the separator
)


def slurm_id(text: str) -> SlurmId:
    """squeue's or sacct's id of a job (123) or of one array element (123_4), as the ledger keeps it."""
    text = text.strip()
    return int(text) if text.isdigit() else text


def conf_of(request: dict[str, Any]) -> str | None:
    """The host's SLURM_CONF as a status, history or logs request names it (every request carries it)."""
    conf = request.get("slurm_conf")
    return str(conf) if conf else None


def env_for(slurm_conf: str | None) -> dict[str, str]:
    """The client commands' environment: this one, with the host's SLURM_CONF where it names one."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = str(slurm_conf)
    return env


def slurm(argv: list[str], env: dict[str, str], timeout: float = 60, stdin: str | None = None) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        raise ControllerDown(f"{argv[0]} not found on the submit host") from None
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        words = f": {said.strip().splitlines()[-1]}" if said.strip() else ""
        raise ControllerDown(f"{argv[0]} did not answer within {timeout:g}s{words}") from None
    return proc.returncode, proc.stdout, proc.stderr


def slurm_time(text: str) -> float | None:
    """Slurm's local ISO time (2026-12-02T22:17:18) as epoch seconds; None for N/A, Unknown, None, NONE."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def squeue(env: dict[str, str]) -> Live:
    """Every plan job squeue still knows (comment plan=PLAN@HASH), by Slurm id (each array element on its own),
    with Slurm's own clocks."""
    fmt = ",".join(f"{f}:|" for f in SQUEUE_FIELDS)
    rc, out, err = slurm(["squeue", "-h", "-a", "-r", "-t", "all", "-O", fmt], env)
    if rc != 0:
        raise ControllerDown(err.strip() or f"squeue exited {rc}")
    jobs: Live = {}
    for line in out.splitlines():
        parts = line.split("|", len(SQUEUE_FIELDS) - 1)
        if len(parts) < len(SQUEUE_FIELDS) or not parts[9].startswith("plan="):
            continue
        plan, _, digest = parts[9][5:].partition("@")
        job_id = slurm_id(parts[0])
        jobs[job_id] = LiveJob(
            id=job_id,
            job_id=parts[10].strip(),
            name=parts[1],
            state=parts[2].split()[0],
            reason=parts[3],
            plan=plan,
            hash=digest,
            dependency=parts[8],
            start=slurm_time(parts[4]) if parts[2] not in ACTIVE else None,
            end=slurm_time(parts[5]),
            eligible=slurm_time(parts[6]),
            submitted=slurm_time(parts[7]),
            restarts=int(parts[11]) if parts[11].strip().isdigit() else 0,
            workdir=parts[12][:-1] if parts[12].endswith("|") else parts[12],
        )
    return jobs


SACCT_FORMAT = "JobID,JobName,State,Start,End,Comment,ExitCode,Reason,Eligible"


def sacct(
    env: dict[str, str], ids: list[SlurmId], since: str | None = None, fields: str = SACCT_FORMAT
) -> tuple[bool, str, list[str]]:
    """(accounting on, why not, lines): sacct's allocation lines for IDS (or since SINCE)."""
    argv = ["sacct", "-P", "-n", "-X", f"--format={fields}"]
    argv += ["-j", ",".join(str(i) for i in ids)] if ids else ["-S", since or "now-30days", "-E", "now"]
    try:
        rc, out, err = slurm(argv, env, timeout=120)
    except ControllerDown as exc:
        return False, str(exc), []
    if rc != 0:
        return False, (err.strip() or f"sacct exited {rc}").splitlines()[-1], []
    return True, "", out.splitlines()


def sacct_states(lines: list[str]) -> dict[SlurmId, Accounted]:
    found: dict[SlurmId, Accounted] = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) < 9 or not parts[0].split("_")[0].isdigit():
            continue
        job_id = slurm_id(parts[0])
        found[job_id] = Accounted(
            id=job_id,
            state=parts[2].split()[0],
            reason=parts[7],
            start=slurm_time(parts[3]),
            end=slurm_time(parts[4]),
            eligible=slurm_time(parts[8]),
        )
    return found


def sync(root: str, ledger: Ledger, live: Live, env: dict[str, str]) -> str:
    """Fold result files, squeue and (for what squeue forgot) sacct into the ledger. Returns why sacct is off
    ("" when it answered or was not needed)."""
    ledger_mod.fold_results(root, ledger)
    forgotten: list[tuple[dict[str, JobRecord], str, SlurmId]] = []
    for entry in ledger.plans.values():
        for name, record in entry.jobs.items():
            last = record.current
            if last is None or last.id is None:
                continue
            found = live_of(record, last.id, live)
            if found is not None:
                entry.jobs[name] = ledger_mod.record_state(record, found)
            elif last.state not in ledger_mod.FINAL and last.state != "GATED":
                forgotten.append((entry.jobs, name, last.id))
    if not forgotten:
        return ""
    on, why, lines = sacct(env, [i for _, _, i in forgotten])
    if on:
        accounted = sacct_states(lines)
        for jobs, name, job_id in forgotten:
            if job_id in accounted:
                jobs[name] = ledger_mod.record_state(jobs[name], accounted[job_id])
    return why


def live_of(record: JobRecord, job_id: SlurmId | None, live: Live) -> LiveJob | None:
    """squeue's job JOB_ID if it is still this ledger job: a restarted controller may reuse ids for other jobs.
    An attempt that ran as an array element carries the array's name; the others the job's."""
    found = live.get(job_id) if job_id is not None else None
    if found is None:
        return None
    named = next((a.slurm_name for a in record.attempts if a.id == job_id and a.slurm_name), None)
    expected = named or record.slurm_name
    return None if expected and found.name != expected else found


def state_of(record: JobRecord | None, live: Live) -> tuple[str, Attempt | None]:
    """The current attempt's state: squeue's while it knows the job, else the ledger's final one, else UNKNOWN."""
    last = record.current if record else None
    if record is None or last is None:
        return "NONE", None
    found = live_of(record, last.id, live)
    if found is not None:
        return found.state, last
    return last.state or "UNKNOWN", last
