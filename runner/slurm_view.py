"""`plan status` and `plan report` on a Slurm host, from Slurm's own clocks and the ledger.

Running jobs per lane with their start times (squeue StartTime), waits measured from the eligible time, and
each attempt's events (start, done, failed, retry, timeout, blocked, cancelled, requires-wait) written once
with the time Slurm or the attempt's wrapper recorded, not the time of the probe that noticed them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runner import delivery
from runner import slurm_ledger as ledger_mod
from runner.logs import last_line, tail_lines
from runner.queue import Queue
from runner.slurm_ledger import ACTIVE, FINISHED_BAD, RUNNING
from runner.slurm_query import ControllerDown, env_for, live_of, squeue, state_of, sync
from runner.slurm_wrapper import job_paths
from runner.vocab import Event, Reason

REASONS = {
    "Dependency": Reason.REQUIRES,
    "DependencyNeverSatisfied": Reason.BLOCKED,
    "Licenses": Reason.EXCLUSIVE,
    "Resources": Reason.LANE_BUSY,
    "Priority": Reason.ORDER,
    "BeginTime": Reason.BACKOFF,
    "JobHeldUser": Reason.PARKED,
    "JobHeldAdmin": Reason.PARKED,
}
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


def blocked(
    record: dict[str, Any], attempt: dict[str, Any], plan_jobs: dict[str, Any], live: dict[int, dict[str, Any]]
) -> bool:
    """Cancelled because a producer failed: squeue says DependencyNeverSatisfied; sacct only says Dependency,
    so then a producer's failure in the ledger decides."""
    seen = live_of(record, attempt["id"], live) or {}
    if attempt.get("state") != "CANCELLED" and seen.get("state") != "CANCELLED":
        return False
    reason = seen.get("reason") or attempt.get("reason") or ""
    if reason == "DependencyNeverSatisfied":
        return True
    return reason.startswith("Dependency") and any(
        state_of(plan_jobs.get(dep), live)[0] in FINISHED_BAD for dep in record.get("deps", [])
    )


def never_ran(info: dict[str, Any]) -> bool:
    """Cancelled while pending: Slurm gives it a start time (the cancel's), but its reason is still why it was
    waiting (Dependency, Resources, ...); a job cancelled while it ran has reason None."""
    return info.get("state") == "CANCELLED" and info.get("reason") not in (None, "", "None")


def attempt_events(
    root: str, ledger: dict[str, Any], live: dict[int, dict[str, Any]], plan: str | None = None
) -> list[tuple[float, str, Event, dict[str, Any], str]]:
    """(ts, job key, event, details, seen key) for every attempt start and end the ledger and squeue know."""
    out: list[tuple[float, str, Event, dict[str, Any], str]] = []
    for plan_name, entry in ledger["plans"].items():
        if plan is not None and plan_name != plan:
            continue
        jobs = entry.get("jobs") or {}
        for name, record in jobs.items():
            attempts = record.get("attempts") or []
            key, lane = job_key(plan_name, name), record.get("lane", "")
            for index, attempt in enumerate(attempts):
                seen = live_of(record, attempt["id"], live) or {}
                info = {**attempt, **{k: v for k, v in seen.items() if v is not None}}
                if attempt.get("result"):  # the wrapper's own record wins over what Slurm saw of it
                    info.update({k: attempt[k] for k in ("start", "end", "state") if attempt.get(k)})
                base = {"slurm_id": attempt["id"], "attempt": attempt.get("attempt", 1), "lane": lane}
                if (
                    info.get("start")
                    and attempt.get("kind") != "gated"
                    and info.get("state") not in ACTIVE
                    and not never_ran(info)
                ):
                    out.append((float(info["start"]), key, Event.START, base, f"{attempt['id']}:start"))
                end = info.get("end")
                nxt = attempts[index + 1] if index + 1 < len(attempts) else None
                kind: Event | None
                if attempt.get("kind"):
                    kind = _RESULT_EVENT.get(str(attempt["kind"]))
                    if nxt is not None and attempt["kind"] in ("failed", "timeout"):
                        kind = Event.RETRY
                elif info.get("state") in ledger_mod.FINAL and info.get("state") not in RUNNING:
                    kind = _STATE_EVENT.get(str(info["state"]))
                    if kind is Event.CANCELLED and blocked(record, attempt, jobs, live):
                        kind = Event.BLOCKED
                else:
                    continue
                if kind is None or not end:
                    continue
                details = {**base, "state": info.get("state"), "rc": attempt.get("rc")}
                if kind is Event.RETRY and nxt is not None:
                    details.update(
                        next_attempt=nxt.get("attempt"), next_slurm_id=nxt["id"], backoff_s=attempt.get("wait_s")
                    )
                if kind in (Event.FAILED, Event.TIMEOUT, Event.RETRY):
                    details["tail"] = attempt.get("tail") or tail_lines(job_paths(root, plan_name, name, "")["log"], 5)
                if info.get("reason") and kind in (Event.CANCELLED, Event.BLOCKED):
                    details["reason"] = info["reason"]
                out.append((float(end), key, kind, details, f"{attempt['id']}:end"))
    out.sort(key=lambda e: e[0])
    return out


def _waiting(
    key: str,
    lane: str,
    record: dict[str, Any],
    last: dict[str, Any],
    cur: dict[str, Any] | None,
    names: dict[int, str],
    now: float,
) -> dict[str, Any]:
    reason_text = cur["reason"] if cur else "BeginTime"
    reason = REASONS.get(reason_text, Reason.ORDER)
    detail = reason_text
    if reason is Reason.BACKOFF and last.get("after") == "gated":
        reason, detail = Reason.REQUIRES, "its external REQUIRES was false; checked again at the begin time"
    elif reason is Reason.BACKOFF:
        detail = f"attempt {last.get('attempt', 1)} waits out the retry backoff"
    blocker = ""
    if cur and cur["dependency"] not in ("(null)", ""):
        waits = [
            names.get(int(p.split("(")[0].split("_")[0]), p)
            for p in cur["dependency"].replace(",", ":").split(":")
            if p[:1].isdigit()
        ]
        blocker = ", ".join(waits)
        detail += f": {blocker}"
    since = (cur or {}).get("eligible") or (cur or {}).get("submitted") or last.get("submitted") or now
    return {
        "job": key,
        "lane": lane,
        "reason": reason.value,
        "detail": detail,
        "blocker": blocker,
        "since": since,
        "slurm_id": last["id"],
    }


def status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """status.json's shape from squeue and the ledger; attempt starts and ends recorded as events, once."""
    env = env_for(request)
    now = time.time()
    try:
        live = squeue(env)
    except ControllerDown as exc:
        return {"controller_down": str(exc)}
    got = delivery.lock(root, {"wait_s": 10, "by": "plan status"})
    try:
        ledger = ledger_mod.load(root)
        sync(root, ledger, live, env)
        if got.get("locked"):
            seen = ledger.setdefault("seen", {})
            queue = Queue(Path(root))
            try:
                for ts, key, kind, details, mark in attempt_events(root, ledger, live):
                    if not seen.get(mark):
                        queue.emit(ts, key, kind.value, **details)
                        seen[mark] = True
            finally:
                queue.close()
            ledger_mod.save(root, ledger)
    finally:
        if got.get("locked"):
            delivery.release_lock()
    shown = view(root, ledger, live, now)
    return {"status": shown, "runner_alive": True, "now": now, "counts": shown["counts"]}


def view(root: str, ledger: dict[str, Any], live: dict[int, dict[str, Any]], now: float) -> dict[str, Any]:
    running: list[dict[str, Any]] = []
    queued: list[dict[str, Any]] = []
    lanes: dict[str, dict[str, Any]] = {}
    counts = {"queue": 0, "running": 0, "done": 0, "failed": 0}
    names = {
        a["id"]: job_key(p, n)
        for p, e in ledger["plans"].items()
        for n, r in (e.get("jobs") or {}).items()
        for a in r.get("attempts") or []
    }
    for plan, entry in sorted(ledger["plans"].items()):
        jobs = entry.get("jobs") or {}
        for name, record in sorted(jobs.items()):
            state, last = state_of(record, live)
            if last is None:
                continue
            key, lane = job_key(plan, name), record.get("lane", "")
            cur = live_of(record, last["id"], live)
            if state in RUNNING:
                counts["running"] += 1
                log = job_paths(root, plan, name, "")["log"]
                start = (cur or {}).get("start") or now
                running.append(
                    {
                        "job": key,
                        "lane": lane,
                        "pid": last["id"],
                        "slurm_id": last["id"],
                        "attempt": last.get("attempt", 1),
                        "started": start,
                        "elapsed_s": now - start,
                        "log_size": _size(log),
                        "log_grew_at": _mtime(log) or now,
                        "last_line": last_line(log),
                        "warn_after_s": None,
                    }
                )
                lanes.setdefault(lane, {"state": "running", "running": []})["running"].append(key)
            elif state in ACTIVE or state == "GATED":
                counts["queue"] += 1
                queued.append(_waiting(key, lane, record, last, cur, names, now))
            elif state == "COMPLETED":
                counts["done"] += 1
            else:
                counts["failed"] += 1
                if blocked(record, last, jobs, live):
                    item = _waiting(key, lane, record, last, cur, names, now)
                    bad = [d for d in record.get("deps", []) if state_of(jobs.get(d), live)[0] in FINISHED_BAD]
                    item.update(
                        reason=Reason.BLOCKED.value,
                        blocker=", ".join(bad),
                        detail=f"its producer {', '.join(bad) or '?'} failed ({item['detail']})",
                    )
                    queued.append(item)
            lanes.setdefault(lane, {"state": "idle", "running": []})
    return {
        "runner": {
            "pid": None,
            "version": "slurm",
            "format_version": 1,
            "heartbeat": now,
            "tick": 0,
            "root": root,
            "backend": "slurm",
        },
        "lanes": lanes,
        "running": running,
        "queued": queued,
        "parked": None,
        "counts": counts,
    }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def history(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """The ledger's attempts as events (Slurm's clocks), completed by sacct where accounting is on, for a report.
    Jobs are identified by their ledger ids, so sacct's Comment column (job_comment) is not needed."""
    env = env_for(request)
    try:
        live = squeue(env)
    except ControllerDown as exc:
        return {"accounting": False, "why": str(exc), "events": []}
    ledger = ledger_mod.load(root)
    why = sync(root, ledger, live, env)
    if not why:  # nothing was forgotten by squeue: ask sacct anyway, to say whether accounting is on
        from runner.slurm_query import sacct

        on, why, _ = sacct(env, [], request.get("since"))
        why = "" if on else why
    plan = request.get("plan")
    events = [
        {"ts": _iso(ts), "job": key, "event": kind.value, **details}
        for ts, key, kind, details, _ in attempt_events(root, ledger, live, plan)
    ]
    return {"accounting": not why, "why": why, "events": events, "plans": sorted(ledger["plans"])}


def _iso(ts: float) -> str:
    from runner.queue import timestamp

    return timestamp(ts)
