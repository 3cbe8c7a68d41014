"""The Slurm ledger (runner.slurm.ledger) is a cache of Slurm's truth: what it lacks is taken from squeue (each
job's `plan=` comment, its name PLAN/NAME and its working directory, this root), the attempts' result files
and, where accounting is on, sacct; what none of them can account for is marked lost, never forgotten.

All of it is read only when the ledger cannot be trusted: missing under a root a push used, unreadable, cut
short, or only its previous generation (slurm.json.1) readable, which misses the last save's submissions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.files import read_json_or_none
from runner.slurm import ledger as ledger_mod
from runner.slurm.query import Live, sacct, slurm_time
from runner.slurm.records import Attempt, AttemptResult, JobRecord, Ledger, SlurmId, parse_result

LOST = "LOST"  # the state of a job a push prepared that nothing left a trace of (it may run, or have run)


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def _members(root: str, plan: str, tag: str) -> list[Any] | None:
    """The [name, hash] per element of the array whose comment names TAG (array.SHA); None if unknown."""
    if not tag.startswith("array.") or "/" in tag:
        return None
    found = read_json_or_none(Path(root) / "scripts" / plan / f"{tag}.json")
    return found if isinstance(found, list) else None


def _id_order(job_id: SlurmId | None) -> tuple[int, int]:
    array, _, task = str(job_id).partition("_")
    return (int(array) if array.isdigit() else 0, int(task) if task.isdigit() else -1)


def _add(ledger: Ledger, plan: str, name: str, attempt: Attempt) -> bool:
    """Add ATTEMPT to NAME's record unless its id is there already; attempts kept in submission order."""
    jobs = ledger_mod.plan_jobs(ledger, plan)
    record = jobs.get(name) or JobRecord()
    if any(a.id == attempt.id for a in record.attempts):
        return False
    attempts = sorted([a for a in record.attempts if a.state != LOST] + [attempt], key=lambda a: _id_order(a.id))
    jobs[name] = replace(
        record,
        attempts=tuple(attempts),
        slurm_name=record.slurm_name or f"{plan}/{name}",
        hash=attempt.hash or record.hash,
    )
    return True


def from_squeue(root: str, ledger: Ledger, live: Live) -> list[str]:
    """Jobs squeue has under this root that the ledger lacks, added to it; what was added, as PLAN/NAME (ID)."""
    added = []
    for job_id, job in sorted(live.items(), key=lambda item: _id_order(item[0])):
        if not job.workdir or not _same_dir(job.workdir, root):
            continue
        plan, tag = job.plan, job.hash.partition(":")[0]  # an array's: array.SHA[:its element names]
        named: str | None = None
        if tag.startswith("array"):
            members = _members(root, plan, tag)
            task = str(job_id).partition("_")[2]
            if members is None or not task.isdigit() or int(task) >= len(members):
                continue
            name, digest = members[int(task)]
            named = job.name
        else:
            prefix = f"{plan}/"
            if not job.name.startswith(prefix):
                continue
            name, digest = job.name[len(prefix) :], tag
        attempt = Attempt(id=job_id, hash=digest, submitted=job.submitted, slurm_name=named)
        if _add(ledger, plan, name, attempt):
            added.append(f"{plan}/{name} ({job_id})")
    return added


def _results(root: str) -> list[tuple[str, str, AttemptResult]]:
    """Every result file under ROOT/results that can be read, as (plan, name, result)."""
    base = Path(root) / "results"
    found = []
    for plan in _listdir(base):
        for name in _listdir(base / plan):
            for entry in _listdir(base / plan / name):
                if not entry.endswith(".json") or entry.startswith("."):
                    continue
                result = parse_result(read_json_or_none(base / plan / name / entry))
                if isinstance(result, AttemptResult):
                    found.append((plan, name, result))
    return found


def from_results(root: str, ledger: Ledger) -> int:
    """Attempts whose wrapper left ROOT/results/PLAN/NAME/ID.json, with the next try each submitted."""
    count = 0
    for plan, name, found in _results(root):
        attempt = ledger_mod.with_result(Attempt(id=found.id), found)
        count += _add(ledger, plan, name, replace(attempt, state=found.state))
        if found.next_id:
            nxt = Attempt(id=found.next_id, attempt=found.next_attempt or 1, after=found.kind)
            count += _add(ledger, plan, name, nxt)
    return count


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def from_sacct(root: str, ledger: Ledger, env: dict[str, str]) -> tuple[bool, int]:
    """Single jobs (PLAN/NAME) that accounting knows under this root, with their final states; (asked, added)."""
    argv_fields = "JobID,JobName,State,Start,End,WorkDir,Comment"
    on, _, lines = sacct(env, [], None, argv_fields)
    count = 0
    for line in lines if on else []:
        parts = line.split("|")
        if len(parts) < 7 or not parts[0].isdigit() or "/" not in parts[1] or not _same_dir(parts[5], root):
            continue
        plan, _, name = parts[1].partition("/")
        digest = parts[6].partition("@")[2] if parts[6].startswith(f"plan={plan}@") else None
        state = parts[2].split()[0] if parts[2] else None
        attempt = Attempt(
            id=int(parts[0]), hash=digest, state=state, start=slurm_time(parts[3]), end=slurm_time(parts[4])
        )
        count += _add(ledger, plan, name, attempt)
    return on, count


def prepared(root: str) -> dict[str, dict[str, str]]:
    """Plan -> job -> content hash of every job a push prepared to submit (the bundles under scripts/PLAN)."""
    base = Path(root) / "scripts"
    found: dict[str, dict[str, str]] = {}
    for plan in _listdir(base):
        for entry in _listdir(base / plan):
            if not (entry.startswith("bundle.") and entry.endswith(".json")):
                continue
            bundle = read_json_or_none(base / plan / entry)
            for element in bundle.get("elements", []) if isinstance(bundle, dict) else []:
                if isinstance(element, dict) and isinstance(element.get("name"), str):
                    found.setdefault(plan, {})[element["name"]] = str(element.get("hash") or "")
    return found


def _fill_hashes(root: str, ledger: Ledger) -> None:
    """An attempt whose content hash no source said: the newest body its attempts wrote (scripts/PLAN/NAME.HASH.job)."""
    for plan, entry in ledger.plans.items():
        for name, record in entry.jobs.items():
            if all(attempt.hash for attempt in record.attempts):
                continue
            bodies = sorted(
                Path(root, "scripts", plan).glob(f"{name}.*.job"), key=lambda p: p.stat().st_mtime, reverse=True
            )
            digest = bodies[0].name[len(name) + 1 : -len(".job")] if bodies else None
            attempts = tuple(a if a.hash else replace(a, hash=digest) for a in record.attempts)
            entry.jobs[name] = replace(record, attempts=attempts, hash=record.hash or digest)


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did, for the push to say: a note, and the jobs it could not account for (PLAN/NAME)."""

    note: str
    lost: tuple[str, ...] = ()


def rebuild(root: str, ledger: Ledger, live: Live, env: dict[str, str], why: str) -> Rebuilt:
    """Complete an untrusted LEDGER from Slurm's truth; the jobs a push prepared that nothing accounts for are
    recorded as LOST (never submitted again without --retry-failed). Returns what was done, for the push to say."""
    added = from_squeue(root, ledger, live)
    results = from_results(root, ledger)
    asked, accounted = from_sacct(root, ledger, env)
    lost: list[str] = []
    for plan, jobs in prepared(root).items():
        known = ledger_mod.plan_jobs(ledger, plan)
        for name, digest in sorted(jobs.items()):
            if name not in known or not known[name].attempts:
                known[name] = JobRecord(
                    hash=digest,
                    slurm_name=f"{plan}/{name}",
                    attempts=(Attempt(id=None, hash=digest, state=LOST),),
                )
                lost.append(f"{plan}/{name}")
    _fill_hashes(root, ledger)
    sources = ["squeue", "the results directory"] + (["sacct"] if asked else [])
    note = (
        f"the ledger could not be trusted ({why}): rebuilt under the push lock from {', '.join(sources)} "
        f"({len(added)} jobs from squeue, {results} attempts from results, {accounted} from sacct)"
    )
    return Rebuilt(note, tuple(lost))


def open_ledger(root: str, live: Live, env: dict[str, str]) -> tuple[Ledger, Rebuilt | None]:
    """The ledger joined with squeue; rebuilt first where it cannot be trusted. (ledger, what a rebuild did)."""
    ledger, why = ledger_mod.read(root)
    if why:
        ledger_mod.fold_results(root, ledger)  # an older generation's attempts first, with the retries they made
        return ledger, rebuild(root, ledger, live, env, why)
    return ledger, None


def lost_job(record: JobRecord | None) -> bool:
    """Whether the job's current attempt is one a rebuild could not account for."""
    last = record.current if record else None
    return last is not None and last.state == LOST
