"""The Slurm ledger (runner.slurm.ledger) is a cache of Slurm's truth: what it lacks is taken from squeue (each
job's `plan=` comment, its name PLAN/NAME and its working directory, this root; an array element's job from
its array's members file), the attempts' result files and, where accounting is on, sacct (array elements
too); what none of them can account for is marked lost, never forgotten.

All of it is read only when the ledger cannot be trusted: missing under a root a push used, unreadable, cut
short, only its previous generation (slurm.json.1) readable, or older than Slurm's truth (a restored backup,
one written before a crash): squeue has a pending or running job under this root, or the results directory an
attempt, that it does not record. Each contact checks that much, from squeue's answer and file names only.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.files import read_json_or_none
from runner.slurm import ledger as ledger_mod
from runner.slurm.ledger import ACTIVE, RUNNING
from runner.slurm.query import sacct, slurm_id, slurm_time
from runner.slurm.records import Attempt, JobRecord, Ledger, LiveJob
from runner.slurm.result import AttemptResult, parse_result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId
    from runner.slurm.query import Live

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


def _pair(members: list[Any] | None, task: str) -> tuple[str, str | None] | None:
    """(name, content hash) of element TASK of an array of MEMBERS."""
    if members is None or not task.isdigit() or int(task) >= len(members):
        return None
    found = members[int(task)]
    if not (isinstance(found, list) and len(found) == 2 and isinstance(found[0], str)):
        return None
    return found[0], str(found[1]) if found[1] else None


def _named(array_name: str, members: list[Any]) -> bool:
    """Whether an array of MEMBERS can be the one named ARRAY_NAME: FIRST..LAST, or its group (`shard-*`, each
    element's name matching it)."""
    names = [m[0] if isinstance(m, list) and m and isinstance(m[0], str) else "" for m in members]
    first, sep, last = array_name.partition("..")
    if sep:
        return bool(names) and names[0] == first and names[-1] == last
    return bool(names) and all(fnmatch.fnmatchcase(name, array_name) for name in names)


def element_by_name(root: str, plan: str, array_name: str, task: str) -> tuple[str, str | None] | None:
    """(name, content hash) of element TASK of the array named PLAN/ARRAY_NAME, from the members files of the
    plan's arrays it can be (sacct without job_comment has no comment to name its file by): the name where they
    all agree, the hash where they agree too (else None: the newest body is taken)."""
    found = set()
    for path in Path(root, "scripts", plan).glob("array.*.json"):
        members = read_json_or_none(path)
        if isinstance(members, list) and _named(array_name, members):
            pair = _pair(members, task)
            if pair is not None:
                found.add(pair)
    names = {name for name, _ in found}
    if len(names) != 1:
        return None
    return names.pop(), found.pop()[1] if len(found) == 1 else None


def _id_order(job_id: SlurmId | None) -> tuple[int, int]:
    array, _, task = str(job_id).partition("_")
    return (int(array) if array.isdigit() else 0, int(task) if task.isdigit() else -1)


def _add(ledger: Ledger, plan: str, name: str, attempt: Attempt, numbered: bool = True) -> bool:
    """Add ATTEMPT to NAME's record unless its id is there already; attempts kept in submission order. One not
    NUMBERED (squeue and sacct do not say which attempt a job is) is the next try its predecessor's result
    expected, where it expected one (a next try its wrapper's sbatch took for failed reached the controller)."""
    jobs = ledger_mod.plan_jobs(ledger, plan)
    record = jobs.get(name) or JobRecord()
    if any(a.id == attempt.id for a in record.attempts):
        return False
    attempts = sorted([a for a in record.attempts if a.state != LOST] + [attempt], key=lambda a: _id_order(a.id))
    at = attempts.index(attempt)
    before = attempts[at - 1] if at else None
    if not numbered and before and before.next_attempt and not before.next_id and isinstance(attempt.id, int):
        cause = before.cause or ((before.kind or "failed").upper() if before.retry_due is not None else None)
        attempts[at - 1] = replace(before, next_id=attempt.id, retry_due=None, cause=cause)
        attempts[at] = replace(attempt, attempt=before.next_attempt, after=before.kind)
    jobs[name] = replace(
        record,
        attempts=tuple(attempts),
        slurm_name=record.slurm_name or f"{plan}/{name}",
        hash=attempts[-1].hash or record.hash,  # the current attempt's content
    )
    return True


def _squeue_job(root: str, job_id: SlurmId, job: LiveJob) -> tuple[str, str, str | None, str | None] | None:
    """(plan, name, content hash, the array's Slurm name for an element) of a squeue job under this root; None
    for another root's, or one whose plan job cannot be told (an element whose members file is gone)."""
    if not job.workdir or not _same_dir(job.workdir, root):
        return None
    plan, tag = job.plan, job.hash.partition(":")[0]  # an array's: array.SHA[:its element names]
    if tag.startswith("array"):
        pair = _pair(_members(root, plan, tag), str(job_id).partition("_")[2])
        return None if pair is None else (plan, pair[0], pair[1], job.name)
    prefix = f"{plan}/"
    return (plan, job.name[len(prefix) :], tag, None) if job.name.startswith(prefix) else None


def from_squeue(root: str, ledger: Ledger, live: Live) -> list[str]:
    """Jobs squeue has under this root that the ledger lacks, added to it; what was added, as PLAN/NAME (ID)."""
    added = []
    for job_id, job in sorted(live.items(), key=lambda item: _id_order(item[0])):
        found = _squeue_job(root, job_id, job)
        if found is None:
            continue
        plan, name, digest, named = found
        if _add(ledger, plan, name, Attempt(id=job_id, hash=digest, submitted=job.submitted, slurm_name=named), False):
            added.append(f"{plan}/{name} ({job_id})")
    return added


def unplaced(root: str, live: Live) -> list[str]:
    """Pending or running array elements squeue has under this root whose plan job cannot be told (the array's
    members file is gone): a rebuild cannot account for them, as PLAN (ID)."""
    return [
        f"{job.plan} ({job_id})"
        for job_id, job in sorted(live.items(), key=lambda item: _id_order(item[0]))
        if (job.state in ACTIVE or job.state in RUNNING)
        and job.hash.startswith("array")
        and job.workdir
        and _same_dir(job.workdir, root)
        and _squeue_job(root, job_id, job) is None
    ]


def untracked(root: str, ledger: Ledger, live: Live) -> list[str]:
    """What Slurm's truth has under this root that LEDGER (its result files folded in) does not record, as
    PLAN/NAME (ID): a pending or running job of squeue, or an attempt's result file. A ledger that misses any is
    older than that truth (a restored backup, one written before a crash). squeue's ended jobs are not asked:
    a job a push retired stays there, cancelled, for MinJobAge."""
    known = {
        (plan, name): {str(a.id) for a in record.attempts}
        for plan, entry in ledger.plans.items()
        for name, record in entry.jobs.items()
    }
    by_plan: dict[str, set[str]] = {}
    for (plan, _), ids in known.items():
        by_plan.setdefault(plan, set()).update(ids)
    found = []
    for job_id, job in sorted(live.items(), key=lambda item: _id_order(item[0])):
        if (job.state in ACTIVE or job.state in RUNNING) and str(job_id) not in by_plan.get(job.plan, set()):
            if job.workdir and _same_dir(job.workdir, root):
                who = _squeue_job(root, job_id, job)
                found.append(f"{who[0]}/{who[1]} ({job_id})" if who else f"{job.plan} ({job_id})")
    base = Path(root) / "results"
    for plan in _listdir(base):
        for name in _listdir(base / plan):
            ids = known.get((plan, name), set())
            for entry in _listdir(base / plan / name):
                said = f"{plan}/{name} ({entry[: -len('.json')]})"
                if entry.endswith(".json") and not entry.startswith(".") and entry[: -len(".json")] not in ids:
                    found += [said] if said not in found else []
    return found


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
            nxt = Attempt(id=found.next_id, attempt=found.next_attempt or 1, after=found.why)
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
        if len(parts) < 7 or "/" not in parts[1] or not _same_dir(parts[5], root):
            continue
        found = _accounted_job(root, parts[0], parts[1], parts[6])
        if found is None:
            continue
        plan, name, digest, named = found
        state = parts[2].split()[0] if parts[2] else None
        attempt = Attempt(id=slurm_id(parts[0]), hash=digest, state=state, slurm_name=named)
        count += _add(ledger, plan, name, replace(attempt, start=slurm_time(parts[3]), end=slurm_time(parts[4])), False)
    return on, count


def _accounted_job(
    root: str, job_id: str, job_name: str, comment: str
) -> tuple[str, str, str | None, str | None] | None:
    """(plan, name, content hash, the array's Slurm name for an element) of a sacct line: a job by its name
    PLAN/NAME, an array's element (ARRAY_TASK) by its array's members file: named in the comment where
    accounting stores comments, else found by the array's name PLAN/FIRST..LAST. None for what is neither (a
    pending array's ARRAY_[0-3], which squeue has)."""
    plan, _, name = job_name.partition("/")
    tag = comment.partition("@")[2] if comment.startswith(f"plan={plan}@") else ""
    if job_id.isdigit():
        return plan, name, tag or None, None
    array, _, task = job_id.partition("_")
    if not (array.isdigit() and task.isdigit()):
        return None
    if tag.startswith("array."):
        pair = _pair(_members(root, plan, tag.partition(":")[0]), task)
    else:
        pair = element_by_name(root, plan, name, task)
    return None if pair is None else (plan, pair[0], pair[1], job_name)


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
    unplaced: tuple[str, ...] = ()  # pending or running jobs of this root squeue has that no plan job is known for


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
    return Rebuilt(note, tuple(lost), tuple(unplaced(root, live)))


def open_ledger(root: str, live: Live, env: dict[str, str]) -> tuple[Ledger, Rebuilt | None]:
    """The ledger joined with squeue; rebuilt first where it cannot be trusted. (ledger, what a rebuild did)."""
    ledger, why = ledger_mod.read(root)
    ledger_mod.fold_results(root, ledger)  # an older generation's attempts too, with the retries they made
    if not why:
        missing = untracked(root, ledger, live)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            why = (
                f"{ledger_mod.LEDGER} (generation {ledger.generation}) is older than Slurm's truth: it does not "
                f"record {', '.join(missing[:5])}{more}"
            )
    if why:
        return ledger, rebuild(root, ledger, live, env, why)
    return ledger, None


def lost_job(record: JobRecord | None) -> bool:
    """Whether the job's current attempt is one a rebuild could not account for."""
    last = record.current if record else None
    return last is not None and last.state == LOST
