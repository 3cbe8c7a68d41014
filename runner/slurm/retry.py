"""Retries the attempt's own wrapper could not submit, made at the next push, status or watch contact under the
push lock: an attempt Slurm ended itself (memory, its time limit, a node failure, preemption: the wrapper is
killed with it) is retried like one whose body failed, and a next try the wrapper could not submit (the
controller did not answer) is submitted now, never dropped. The dependents Slurm cancelled meanwhile (their
producer had failed, as far as Slurm knew) are submitted again after it, so the plan goes on as if the wrapper
had re-pointed them itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from runner.backoff import backoff_s
from runner.slurm.bundle import Element, find_element, read_element
from runner.slurm.ledger import ACTIVE, RUNNING
from runner.slurm.query import live_of, slurm, state_of
from runner.slurm.records import Attempt, JobRecord, Ledger
from runner.slurm.submit import hand_over
from runner.slurm.wrapper import retry_script, submit_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId
    from runner.slurm.query import Live

# What Slurm ends an attempt with that the attempt's own wrapper cannot see to (it is killed with it)
SLURM_ENDED = ("OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL")


def spec_of(root: str, plan: str, name: str, record: JobRecord) -> Element | None:
    """The bundle element of NAME's current content (located in its bundle): where its attempts were, or the
    newest bundle of the plan holding it (a ledger rebuilt, or written before attempts named their bundle)."""
    for attempt in reversed(record.attempts):
        if attempt.bundle is not None and attempt.entry is not None:
            found = read_element(attempt.bundle, attempt.entry)
            if isinstance(found, Element):
                return found
    bundles = sorted(Path(root, "scripts", plan).glob("bundle.*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in bundles:
        element = find_element(str(path), name, record.hash)
        if element is not None:
            return element
    return None


@dataclass(frozen=True)
class Due:
    """A next try a job needs now: its attempt number, how long it waits, and why (the cause said)."""

    attempt: int
    wait_s: float
    cause: str


def _due(root: str, plan: str, name: str, record: JobRecord, live: Live, now: float) -> Due | None:
    """The next try NAME needs now, if any."""
    state, last = state_of(record, live)
    if last is None or last.next_id:
        return None
    if last.retry_due is not None:  # its wrapper could not submit it
        return Due(
            attempt=last.next_attempt or last.attempt + 1,
            wait_s=max(1.0, last.retry_due - now),
            cause=(last.cause or last.kind or "failed").upper(),
        )
    if state not in SLURM_ENDED or last.result:
        return None
    element = spec_of(root, plan, name, record)
    if element is None or last.attempt >= element.retries:
        return None
    wait_s = backoff_s(last.attempt, element.backoff_base_s, element.backoff_max_s)
    return Due(last.attempt + 1, max(1.0, (last.end or now) + wait_s - now), state)


def _submit(
    root: str, plan: str, name: str, record: JobRecord, attempt: int, extra: list[str], env: dict[str, str]
) -> tuple[int, Attempt] | str:
    """ATTEMPT of NAME as a new Slurm job with EXTRA options (--begin, --dependency): its id and new attempt (for
    the caller to add to the record), or why it could not be submitted."""
    element = spec_of(root, plan, name, record)
    if element is None:
        return f"{plan}/{name}: no bundle holds its script any more"
    script = retry_script(element, attempt)
    rc, out, err = slurm(
        ["sbatch", "--parsable", *element.sbatch, *extra], submit_env(env.get("SLURM_CONF")), 60, script
    )
    if rc != 0:
        return err.strip()
    new = int(out.strip().split(";")[0])
    return new, Attempt(
        id=new,
        hash=element.hash,
        attempt=attempt,
        submitted=time.time(),
        bundle=element.bundle,
        entry=element.entry,
    )


def _order(job_id: SlurmId | None) -> int:
    return int(str(job_id).partition("_")[0] or 0)


def _cancelled_for_a_producer(record: JobRecord, live: Live) -> Attempt | None:
    """The current attempt, if Slurm cancelled it because a producer failed (not a user's scancel)."""
    state, last = state_of(record, live)
    if last is None or state != "CANCELLED" or last.result:
        return None
    seen = live_of(record, last.id, live)
    reason = (seen.reason if seen else "") or last.reason
    return last if reason.startswith("Dependency") else None


def requeue_dependents(root: str, plan: str, jobs: dict[str, JobRecord], live: Live, env: dict[str, str]) -> list[str]:
    """Submit again each job Slurm cancelled for a producer that has had a next try since (its current attempt
    newer than the cancelled job), after that try; a chain of them in one sweep, producers first."""
    done: list[str] = []
    changed = True
    while changed:
        changed = False
        for name in sorted(jobs):
            record = jobs[name]
            cancelled = _cancelled_for_a_producer(record, live)
            if cancelled is None:
                continue
            waits, retried, lost = [], False, False
            for dep in record.deps:
                state, last = state_of(jobs.get(dep), live)
                if last is None:
                    continue
                newer = _order(last.id) > _order(cancelled.id)
                if state in ACTIVE or state in RUNNING or state == "COMPLETED" and newer:
                    retried = retried or newer
                    if state != "COMPLETED":
                        waits.append(str(last.id))
                elif state != "COMPLETED":
                    lost = True  # a producer failed for good: the job stays blocked
            if not retried or lost:
                continue
            extra = [f"--dependency=afterok:{':'.join(waits)}"] if waits else []
            again = _submit(root, plan, name, record, cancelled.attempt, extra, env)
            if isinstance(again, str):
                done.append(f"{plan}/{name}: could not be submitted again: {again}")
                continue
            jobs[name] = record.with_attempt(again[1])
            done.append(f"{plan}/{name}: submitted again as {again[0]}{', after ' + ', '.join(waits) if waits else ''}")
            changed = True
    return done


def retry_due(root: str, ledger: Ledger, live: Live, env: dict[str, str], now: float | None = None) -> list[str]:
    """Submit every next try that is due and the dependents Slurm cancelled for want of it; what was done, a
    line each (for the caller's answer)."""
    now = time.time() if now is None else now
    done: list[str] = []
    for plan, entry in ledger.plans.items():
        jobs = entry.jobs
        for name in sorted(jobs):
            record = jobs[name]
            due = _due(root, plan, name, record, live, now)
            last = record.current
            if due is None or last is None or last.id is None:
                continue
            submitted = _submit(root, plan, name, record, due.attempt, [f"--begin=now+{int(due.wait_s)}"], env)
            if isinstance(submitted, str):
                done.append(f"{plan}/{name}: the next try could not be submitted: {submitted}")
                continue
            new_id, new = submitted
            retried = replace(
                last, next_id=new_id, wait_s=due.wait_s, cause=due.cause, retried_by="agent", retry_due=None
            )
            jobs[name] = record.with_current(retried).with_attempt(replace(new, after=due.cause.lower()))
            done.append(f"{plan}/{name}: attempt {due.attempt} is Slurm job {new_id} (after {due.cause})")
            done += [f"{plan}/{name}: re-pointed {moved}" for moved in hand_over(last.id, new_id, live, env)]
        done += requeue_dependents(root, plan, jobs, live, env)
    return done
