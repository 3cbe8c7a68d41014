"""Each Slurm attempt's events (start, done, failed, retry, timeout, blocked, cancelled, requires-wait) from the
ledger and squeue, with the time Slurm or the attempt's wrapper recorded, not the time of the probe that
noticed them; and `plan report`'s history made of them (runner.slurm.view shows the present)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

from runner.queue import timestamp
from runner.slurm import ledger as ledger_mod
from runner.slurm.ledger import ACTIVE, FINISHED_BAD, RUNNING
from runner.slurm.query import ControllerDown, conf_of, env_for, live_of, sacct, squeue, state_of, sync
from runner.slurm.rebuild import open_ledger
from runner.slurm.records import Attempt, JobRecord, Ledger
from runner.slurm.retry import SLURM_ENDED
from runner.slurm.timeline import intervals_of, lane_events
from runner.slurm.wrapper import job_paths
from runner.vocab import Event

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.query import Live

_RESULT_EVENT = {"done": Event.DONE, "failed": Event.FAILED, "timeout": Event.TIMEOUT, "gated": Event.REQUIRES_WAIT}
_STATE_EVENT = {
    "COMPLETED": Event.DONE,
    "FAILED": Event.FAILED,
    "TIMEOUT": Event.TIMEOUT,
    "OUT_OF_MEMORY": Event.FAILED,
    "NODE_FAIL": Event.FAILED,
    "CANCELLED": Event.CANCELLED,
    "BOOT_FAIL": Event.FAILED,
    "DEADLINE": Event.TIMEOUT,
    "PREEMPTED": Event.CANCELLED,
}


def job_key(plan: str, name: str) -> str:
    return f"{plan}/{name}.job"


def blocked(record: JobRecord, attempt: Attempt, plan_jobs: dict[str, JobRecord], live: Live) -> bool:
    """Cancelled because a producer failed: squeue says DependencyNeverSatisfied; sacct only says Dependency,
    so then a producer's failure in the ledger decides."""
    seen = live_of(record, attempt.id, live)
    if attempt.state != "CANCELLED" and (seen is None or seen.state != "CANCELLED"):
        return False
    reason = (seen.reason if seen else "") or attempt.reason
    if reason == "DependencyNeverSatisfied":
        return True
    return reason.startswith("Dependency") and any(
        state_of(plan_jobs.get(dep), live)[0] in FINISHED_BAD for dep in record.deps
    )


@dataclass(frozen=True)
class Known:
    """What is known of one attempt: the ledger's, Slurm's over it, the wrapper's own record over both."""

    state: str | None
    reason: str
    start: float | None
    end: float | None


def never_ran(info: Known) -> bool:
    """Cancelled while pending: Slurm gives it a start time (the cancel's), but its reason is still why it was
    waiting (Dependency, Resources, ...); a job cancelled while it ran has reason None."""
    return info.state == "CANCELLED" and info.reason not in ("", "None")


def _event_of(record: JobRecord, attempt: Attempt, info: Known, jobs: dict[str, JobRecord], live: Live) -> Event | None:
    """The event an attempt ended with: its wrapper's kind (a retry where a next attempt followed), else what
    Slurm's final state says; None while it has not ended."""
    followed = record.attempts[-1] is not attempt
    if attempt.retry_due is not None and not followed:
        return None  # its next try is due, not yet submitted: a retry once it is (runner.slurm.retry)
    if attempt.kind:
        if followed and attempt.kind in ("failed", "timeout"):
            return Event.RETRY
        return _RESULT_EVENT.get(attempt.kind)
    if info.state not in ledger_mod.FINAL or info.state in RUNNING:
        return None
    if followed and info.state in SLURM_ENDED:  # the agent submitted its next try (runner.slurm.retry)
        return Event.RETRY
    kind = _STATE_EVENT.get(str(info.state))
    if kind is Event.CANCELLED and blocked(record, attempt, jobs, live):
        return Event.BLOCKED
    return kind


def _end_details(
    root: str, where: tuple[str, str], record: JobRecord, attempt: Attempt, kind: Event, info: Known
) -> dict[str, Any]:
    plan, name = where
    details = {**_base(record, attempt), "rc": attempt.rc}
    if info.state:  # a gate's check has none of its own: a null state is a malformed event
        details["state"] = info.state
    if kind is Event.RETRY:
        nxt = record.attempts[record.attempts.index(attempt) + 1]
        details.update(next_attempt=nxt.attempt, next_slurm_id=nxt.id, backoff_s=attempt.wait_s)
        if attempt.cause:  # OUT_OF_MEMORY, TIMEOUT, NODE_FAIL...: Slurm ended it, or its wrapper's kind
            details["cause"] = attempt.cause
    if kind in (Event.FAILED, Event.TIMEOUT, Event.RETRY):
        details["tail"] = list(attempt.tail) or own_tail(job_paths(root, plan, name, "")["log"], attempt.id)
    if info.reason and kind in (Event.CANCELLED, Event.BLOCKED):
        details["reason"] = info.reason
    return details


def own_tail(path: Path, slurm_id: Any, n: int = 5) -> list[str]:
    """The job's own last lines for attempt SLURM_ID where its wrapper left none (Slurm ended it, the wrapper with
    it): its log after that attempt's header, without the wrapper's lines (`=== `) or Slurm's (`slurmstepd`)."""
    header = f"(Slurm job {slurm_id})"
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    at = text.rfind(header)
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text[text.find("\n", at) + 1 :] if at >= 0 else text)]
    return [ln for ln in lines if ln and not ln.startswith(("=== ", "slurmstepd"))][-n:]


def _base(record: JobRecord, attempt: Attempt) -> dict[str, Any]:
    return {"slurm_id": attempt.id, "attempt": attempt.attempt, "lane": record.lane}


def _seen_info(record: JobRecord, attempt: Attempt, live: Live) -> Known:
    """What is known of one attempt: the ledger's, Slurm's over it, the wrapper's own record over both."""
    seen = live_of(record, attempt.id, live)
    info = Known(attempt.state, attempt.reason, attempt.start, attempt.end)
    if seen is not None:
        info = Known(
            seen.state or info.state,
            seen.reason,
            seen.start if seen.start is not None else info.start,
            seen.end if seen.end is not None else info.end,
        )
    if attempt.result:
        info = Known(attempt.state or info.state, info.reason, attempt.start or info.start, attempt.end or info.end)
    return info


def _started(attempt: Attempt, info: Known) -> bool:
    return bool(info.start and attempt.kind != "gated" and info.state not in ACTIVE and not never_ran(info))


Found = Tuple[float, str, Event, Dict[str, Any], str]


def _job_events(root: str, plan: str, name: str, jobs: dict[str, JobRecord], live: Live) -> list[Found]:
    record = jobs[name]
    key = job_key(plan, name)
    out: list[Found] = []
    for attempt in record.attempts:
        info = _seen_info(record, attempt, live)
        if _started(attempt, info):
            out.append((float(info.start or 0), key, Event.START, _base(record, attempt), f"{attempt.id}:start"))
        kind = _event_of(record, attempt, info, jobs, live)
        if kind is not None and info.end:
            details = _end_details(root, (plan, name), record, attempt, kind, info)
            out.append((float(info.end), key, kind, details, f"{attempt.id}:end"))
    return out


def attempt_events(root: str, ledger: Ledger, live: Live, plan: str | None = None) -> list[Found]:
    """(ts, job key, event, details, seen key) for every attempt start and end the ledger and squeue know."""
    out: list[Found] = []
    for plan_name, entry in ledger.plans.items():
        if plan is None or plan_name == plan:
            jobs = entry.jobs
            for name in jobs:
                out += _job_events(root, plan_name, name, jobs, live)
    out.sort(key=lambda e: e[0])
    return out


def history(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """The ledger's attempts as events (Slurm's clocks), completed by sacct where accounting is on, for a report.
    Jobs are identified by their ledger ids, so sacct's Comment column (job_comment) is not needed."""
    env = env_for(conf_of(request))
    try:
        live = squeue(env)
    except ControllerDown as exc:
        return {"accounting": False, "why": str(exc), "events": []}
    ledger, _ = open_ledger(root, live, env)
    why = sync(root, ledger, live, env)
    if not why:  # nothing was forgotten by squeue: ask sacct anyway, to say whether accounting is on
        on, why, _ = sacct(env, [], request.get("since"))
        why = "" if on else why
    plan = request.get("plan")
    found = attempt_events(root, ledger, live, plan)
    intervals, waits = intervals_of(ledger, plan, lambda r, a: _clocks(r, a, live), time.time())
    started = {mark for _, _, _, _, mark in found if mark.endswith(":start")}
    events = []
    for ts, key, kind, details, mark in found:
        ident = mark.rpartition(":")[0]
        if ident in waits and (mark.endswith(":start") or f"{ident}:start" not in started):
            details = {**details, "waited": waits[ident]}  # its wait by Slurm's reason, on its start (or end)
        events.append((ts, {"ts": _iso(ts), "job": key, "event": kind.value, **details, "t": round(ts, 3)}))
    lanes = [r.lane for p, e in ledger.plans.items() if plan is None or p == plan for r in e.jobs.values()]
    for ts, fields in lane_events(intervals, lanes):  # each lane's busy, waiting (Slurm's reason) and idle
        events.append((ts, {"ts": _iso(ts), "event": Event.LANE.value, **fields, "t": round(ts, 3)}))
    events.sort(key=lambda e: e[0])
    shown = [e for _, e in events]
    return {"accounting": not why, "why": why, "events": shown, "plans": sorted(ledger.plans)}


def _clocks(record: JobRecord, attempt: Attempt, live: Live) -> tuple[float | None, float | None, bool]:
    """An attempt's start, its end, and whether it started. The start is its wrapper's, or the end of the second
    Slurm says it started in where that is earlier (the allocation was the job's from then: its wrapper may take a
    while to start), but never before a contact last saw it pending."""
    info = _seen_info(record, attempt, live)
    seen = live_of(record, attempt.id, live)
    start = info.start
    if seen is not None and seen.start is not None and start is not None and seen.state not in ACTIVE:
        start = max(min(start, seen.start + 1), max((t for _, t in attempt.waits), default=0.0))
    return start, info.end, _started(attempt, info)


def _iso(ts: float) -> str:
    return timestamp(ts)
