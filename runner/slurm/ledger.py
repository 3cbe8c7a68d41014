"""ROOT/slurm.json, the Slurm backend's durable ledger: per plan and job every Slurm id, its script hash and final
state, so a re-push knows what ran long after squeue has forgotten it.

Its records are runner.slurm.records' Ledger, PlanEntry, JobRecord and Attempt (version 2 on disk: {"version": 2,
"generation": N, "plans": {PLAN: {"by", "pushed_at", "lanes", "jobs": {NAME: {"hash", "lane", "deps",
"attempts": [{"id", "hash", "attempt", "submitted", "state", ...}]}}}}, "seen": {MARK: true}}). The last attempt
is the job's current Slurm job. It is written atomically, by whoever holds ROOT/.push.lock (runner.pushlock), the
previous generation kept beside it (slurm.json.1). It is a cache of Slurm's truth, never its only copy: one lost
or damaged is rebuilt (runner.slurm.rebuild). Each attempt's own wrapper (runner.slurm.attempt) never writes it:
it leaves ROOT/results/PLAN/NAME/ID.json when it ends, and those are folded in here under the lock.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from runner.files import atomic_write, read_json
from runner.slurm.records import Attempt, JobRecord, Ledger, RecordError, parse_ledger
from runner.slurm.result import AttemptResult, parse_result

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId
    from runner.slurm.records import Seen

LEDGER = "slurm.json"
FINISHED_OK = ("COMPLETED",)
FINISHED_BAD = ("FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")
FINAL = FINISHED_OK + FINISHED_BAD
ACTIVE = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING")


BACKUP = "slurm.json.1"  # the generation before the last save


def _parse(path: Path) -> tuple[Ledger | None, str]:
    """(the ledger at PATH, "") or (None, why it cannot be used)."""
    try:
        raw = read_json(path)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"not JSON, or cut short ({exc})"
    if raw is None:
        return None, "missing"
    found = parse_ledger(raw)
    if isinstance(found, RecordError):
        return None, str(found) if not found.where else f"not a ledger this version wrote ({found})"
    return found, ""


def read(root: str) -> tuple[Ledger, str]:
    """(the ledger, why it is not to be trusted as it is: "" when it is). A missing, unreadable or cut-short
    slurm.json is never read as empty: the previous generation is taken if it can be, and the caller rebuilds
    from Slurm's truth (runner.slurm.rebuild) either way. A root no push ever wrote to has nothing to distrust."""
    ledger, why = _parse(Path(root) / LEDGER)
    if ledger is not None:
        return ledger, ""
    if why == "missing" and not (Path(root) / "scripts").is_dir():
        return Ledger(), ""
    older, _ = _parse(Path(root) / BACKUP)
    if older is not None:
        return older, f"{LEDGER} is {why}; its previous generation ({BACKUP}) was read"
    return Ledger(), f"{LEDGER} is {why}"


def load(root: str) -> Ledger:
    """The ledger as it is on disk (for readers that write nothing back: logs)."""
    return read(root)[0]


def save(root: str, ledger: Ledger) -> None:
    """Written whole and atomically, the generation it replaces kept as slurm.json.1 (a hard link, so there is
    never a moment without a ledger)."""
    path, backup = Path(root) / LEDGER, Path(root) / BACKUP
    ledger.generation += 1
    if _parse(path)[0] is not None:  # a damaged file is not kept over a good backup
        link = backup.with_name(f".{BACKUP}.{os.getpid()}.tmp")
        try:
            os.link(path, link)
            os.replace(link, backup)
        except OSError:
            try:
                os.unlink(link)
            except OSError:
                pass
    atomic_write(path, (json.dumps(ledger.to_json(), indent=1, sort_keys=True) + "\n").encode())


def plan_jobs(ledger: Ledger, plan: str) -> dict[str, JobRecord]:
    return ledger.plan(plan).jobs


def results_dir(root: str, plan: str, name: str) -> Path:
    return Path(root) / "results" / plan / name


def read_result(root: str, plan: str, name: str, slurm_id: SlurmId) -> AttemptResult | None:
    """The result file attempt SLURM_ID of PLAN/NAME left, if it left one that can be read."""
    path = results_dir(root, plan, name) / f"{slurm_id}.json"
    try:
        found = parse_result(read_json(path), str(path))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, AttemptResult) else None


def with_result(last: Attempt, result: AttemptResult) -> Attempt:
    """LAST with what its wrapper recorded when it ended."""
    folded = replace(
        last,
        result=True,
        start=result.start,
        end=result.end,
        rc=result.rc,
        kind=result.kind,
        tail=result.tail,
        attempt=result.attempt,
        wait_s=result.wait_s,
        moved=result.moved,
    )
    if result.retry_due is not None:  # its wrapper could not submit the next try
        folded = replace(folded, retry_due=result.retry_due, next_attempt=result.next_attempt)
    if result.cause and (result.next_id or result.retry_due is not None):  # why it is retried: OUT_OF_MEMORY...
        folded = replace(folded, cause=result.cause)
    if result.state in FINAL:
        folded = replace(folded, state=result.state)
    return folded


def fold_results(root: str, ledger: Ledger) -> list[tuple[str, str, AttemptResult]]:
    """Fold every attempt's result file into the ledger, following each to the next attempt it submitted.

    Returns the (plan, name, result) newly folded, oldest first, for the caller to record as events."""
    folded: list[tuple[str, str, AttemptResult]] = []
    for plan, entry in ledger.plans.items():
        for name in list(entry.jobs):
            while True:
                record = entry.jobs[name]
                last = record.current
                if last is None or last.result or last.id is None:
                    break
                result = read_result(root, plan, name, last.id)
                if result is None:
                    break
                record = record.with_current(with_result(last, result))
                folded.append((plan, name, result))
                if result.next_id:
                    nxt = Attempt(
                        id=result.next_id,  # a retry is a job of its own, never an array's
                        hash=last.hash,
                        attempt=result.next_attempt or 1,
                        submitted=result.end,
                        after=result.why,
                        bundle=last.bundle,  # the same spec, a later attempt
                        entry=last.entry,
                    )
                    record = record.with_attempt(nxt)
                entry.jobs[name] = record
                if not result.next_id:
                    break
    return folded


def record_state(record: JobRecord, seen: Seen) -> JobRecord:
    """RECORD with what squeue or sacct says of its current attempt, kept once final (and its clocks as they
    become known)."""
    last = record.current
    if last is None or last.id != seen.id:
        return record
    # a running or pending job's EndTime is Slurm's projection (its start plus its time limit): not an end
    keys = ("start", "end", "eligible") if seen.state in FINAL else ("start", "eligible")
    clocks = {key: getattr(seen, key) for key in keys if getattr(seen, key) and not getattr(last, key)}
    now = replace(last, **clocks) if clocks else last
    said = seen.reason.split(",")[0].strip()
    if seen.state in ACTIVE and said and (not last.waits or last.waits[-1][0] != said):  # for the report
        now = replace(now, waits=(*last.waits, (said, time.time())))
    if seen.state in FINAL and last.state not in FINAL:
        now = replace(now, state=seen.state, reason=seen.reason)
    return record if now is last else record.with_current(now)


def remove_results(root: str, plan: str, name: str) -> None:
    """A job dropped from the ledger takes its result files with it."""
    directory = results_dir(root, plan, name)
    try:
        for entry in os.listdir(directory):
            os.unlink(directory / entry)
        os.rmdir(directory)
    except OSError:
        pass
