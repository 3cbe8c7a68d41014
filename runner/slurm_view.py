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
from runner.slurm_query import ControllerDown, Live, env_for, live_of, slurm, squeue, state_of, sync
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


def blocked(record: dict[str, Any], attempt: dict[str, Any], plan_jobs: dict[str, Any], live: Live) -> bool:
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


def _event_of(
    record: dict[str, Any], attempt: dict[str, Any], info: dict[str, Any], jobs: dict[str, Any], live: Live
) -> Event | None:
    """The event an attempt ended with: its wrapper's kind (a retry where a next attempt followed), else what
    Slurm's final state says; None while it has not ended."""
    attempts = record.get("attempts") or []
    followed = attempts[-1] is not attempt
    if attempt.get("kind"):
        if followed and attempt["kind"] in ("failed", "timeout"):
            return Event.RETRY
        return _RESULT_EVENT.get(str(attempt["kind"]))
    if info.get("state") not in ledger_mod.FINAL or info.get("state") in RUNNING:
        return None
    kind = _STATE_EVENT.get(str(info["state"]))
    if kind is Event.CANCELLED and blocked(record, attempt, jobs, live):
        return Event.BLOCKED
    return kind


def _end_details(
    root: str, where: tuple[str, str], record: dict[str, Any], attempt: dict[str, Any], kind: Event, info: dict
) -> dict[str, Any]:
    plan, name = where
    details = {**_base(record, attempt), "state": info.get("state"), "rc": attempt.get("rc")}
    attempts = record.get("attempts") or []
    if kind is Event.RETRY:
        nxt = attempts[attempts.index(attempt) + 1]
        details.update(next_attempt=nxt.get("attempt"), next_slurm_id=nxt["id"], backoff_s=attempt.get("wait_s"))
    if kind in (Event.FAILED, Event.TIMEOUT, Event.RETRY):
        details["tail"] = attempt.get("tail") or tail_lines(job_paths(root, plan, name, "")["log"], 5)
    if info.get("reason") and kind in (Event.CANCELLED, Event.BLOCKED):
        details["reason"] = info["reason"]
    return details


def _base(record: dict[str, Any], attempt: dict[str, Any]) -> dict[str, Any]:
    return {"slurm_id": attempt["id"], "attempt": attempt.get("attempt", 1), "lane": record.get("lane", "")}


def _seen_info(record: dict[str, Any], attempt: dict[str, Any], live: Live) -> dict[str, Any]:
    """What is known of one attempt: the ledger's, Slurm's over it, the wrapper's own record over both."""
    seen = live_of(record, attempt["id"], live) or {}
    info = {**attempt, **{k: v for k, v in seen.items() if v is not None}}
    if attempt.get("result"):
        info.update({k: attempt[k] for k in ("start", "end", "state") if attempt.get(k)})
    return info


def _started(attempt: dict[str, Any], info: dict[str, Any]) -> bool:
    return bool(
        info.get("start") and attempt.get("kind") != "gated" and info.get("state") not in ACTIVE and not never_ran(info)
    )


Found = tuple[float, str, Event, dict[str, Any], str]


def _job_events(root: str, plan: str, name: str, jobs: dict[str, Any], live: Live) -> list[Found]:
    record = jobs[name]
    key = job_key(plan, name)
    out: list[Found] = []
    for attempt in record.get("attempts") or []:
        info = _seen_info(record, attempt, live)
        if _started(attempt, info):
            out.append((float(info["start"]), key, Event.START, _base(record, attempt), f"{attempt['id']}:start"))
        kind = _event_of(record, attempt, info, jobs, live)
        if kind is not None and info.get("end"):
            details = _end_details(root, (plan, name), record, attempt, kind, info)
            out.append((float(info["end"]), key, kind, details, f"{attempt['id']}:end"))
    return out


def attempt_events(root: str, ledger: dict[str, Any], live: Live, plan: str | None = None) -> list[Found]:
    """(ts, job key, event, details, seen key) for every attempt start and end the ledger and squeue know."""
    out: list[Found] = []
    for plan_name, entry in ledger["plans"].items():
        if plan is None or plan_name == plan:
            jobs = entry.get("jobs") or {}
            for name in jobs:
                out += _job_events(root, plan_name, name, jobs, live)
    out.sort(key=lambda e: e[0])
    return out


def _dependency_names(cur: dict[str, Any], names: dict[str, str]) -> list[str]:
    """The jobs squeue's %E says CUR waits on, by plan/name where the ledger knows them (aftercorr: the same
    element of the producer array)."""
    task = str(cur["id"]).partition("_")[2]
    waits = []
    for part in cur["dependency"].replace(",", ":").split(":"):
        ident = part.split("(")[0]
        if not ident[:1].isdigit():
            continue
        if ident.endswith("_*") and task:
            ident = f"{ident[:-2]}_{task}"
        waits.append(names.get(ident, ident))
    return waits


def _waiting(
    key: str, record: dict[str, Any], last: dict[str, Any], cur: dict[str, Any] | None, names: dict[str, str]
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
        blocker = ", ".join(_dependency_names(cur, names))
        detail += f": {blocker}"
    since = (cur or {}).get("eligible") or (cur or {}).get("submitted") or last.get("submitted")
    return {
        "job": key,
        "lane": record.get("lane", ""),
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
            _record_events(root, ledger, live)
            ledger_mod.save(root, ledger)
    finally:
        if got.get("locked"):
            delivery.release_lock()
    shown = view(root, ledger, live, now, licences(env))
    return {"status": shown, "runner_alive": True, "now": now, "counts": shown["counts"]}


def _record_events(root: str, ledger: dict[str, Any], live: Live) -> None:
    seen = ledger.setdefault("seen", {})
    queue = Queue(Path(root))
    try:
        for ts, key, kind, details, mark in attempt_events(root, ledger, live):
            if not seen.get(mark):
                queue.emit(ts, key, kind.value, **details)
                seen[mark] = True
    finally:
        queue.close()


def licences(env: dict[str, str]) -> dict[str, int]:
    """The cluster's licences and their totals (`scontrol show licenses`); empty where it does not answer."""
    try:
        rc, out, _ = slurm(["scontrol", "show", "licenses", "-o"], env, 30)
    except ControllerDown:
        return {}
    found = {}
    for line in out.splitlines() if rc == 0 else []:
        fields = dict(word.partition("=")[::2] for word in line.split())
        if fields.get("LicenseName") and fields.get("Total", "").isdigit():
            found[fields["LicenseName"]] = int(fields["Total"])
    return found


def lane_slots(ledger: dict[str, Any], totals: dict[str, int]) -> dict[str, int]:
    """Lane -> how many of its jobs can run at once: a lane's slots are its licence counts on Slurm (the fewest
    jobs any of its licences allows). A lane without licences has no count here."""
    slots: dict[str, int] = {}
    for entry in ledger["plans"].values():
        for lane, wanted in (entry.get("lanes") or {}).items():
            counts = [totals[n] // max(1, int(c)) for n, c in (w.partition(":")[::2] for w in wanted) if n in totals]
            if counts:
                slots[lane] = min(counts)
    return slots


def _running(
    root: str, plan: str, name: str, record: dict[str, Any], last: dict[str, Any], cur: Any, now: float
) -> dict[str, Any]:
    log = job_paths(root, plan, name, "")["log"]
    start = (cur or {}).get("start") or now
    return {
        "job": job_key(plan, name),
        "lane": record.get("lane", ""),
        "pid": int(cur["job_id"]) if cur and str(cur.get("job_id", "")).isdigit() else None,
        "slurm_id": last["id"],
        "attempt": last.get("attempt", 1),
        "started": start,
        "elapsed_s": now - start,
        "log_size": _size(log),
        "log_grew_at": _mtime(log) or now,
        "last_line": last_line(log),
        "warn_after_s": None,
    }


def _blocked_item(item: dict[str, Any], record: dict[str, Any], jobs: dict[str, Any], live: Live) -> dict[str, Any]:
    bad = [d for d in record.get("deps", []) if state_of(jobs.get(d), live)[0] in FINISHED_BAD]
    detail = f"its producer {', '.join(bad) or '?'} failed ({item['detail']})"
    return dict(item, reason=Reason.BLOCKED.value, blocker=", ".join(bad), detail=detail)


def view(
    root: str, ledger: dict[str, Any], live: Live, now: float, totals: dict[str, int] | None = None
) -> dict[str, Any]:
    running: list[dict[str, Any]] = []
    queued: list[dict[str, Any]] = []
    counts = {"queue": 0, "running": 0, "done": 0, "failed": 0}
    names = {str(a["id"]): job_key(p, n) for p, n, r in _records(ledger) for a in r.get("attempts") or []}
    used: set[str] = set()
    for plan, name, record in _records(ledger):
        jobs = ledger["plans"][plan].get("jobs") or {}
        state, last = state_of(record, live)
        if last is None:
            continue
        used.add(record.get("lane", ""))
        cur = live_of(record, last["id"], live)
        if state in RUNNING:
            counts["running"] += 1
            running.append(_running(root, plan, name, record, last, cur, now))
        elif state in ACTIVE or state == "GATED":
            counts["queue"] += 1
            queued.append(_waiting(job_key(plan, name), record, last, cur, names))
        elif state == "COMPLETED":
            counts["done"] += 1
        else:
            counts["failed"] += 1
            if blocked(record, last, jobs, live):
                item = _waiting(job_key(plan, name), record, last, cur, names)
                queued.append(_blocked_item(item, record, jobs, live))
    for item in queued:
        item["since"] = item["since"] or now
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
        "lanes": _lanes(used, running, lane_slots(ledger, totals or {})),
        "running": running,
        "queued": queued,
        "parked": None,
        "counts": counts,
    }


def _records(ledger: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (plan, name, record)
        for plan, entry in sorted(ledger["plans"].items())
        for name, record in sorted((entry.get("jobs") or {}).items())
    ]


def _lanes(used: set[str], running: list[dict[str, Any]], slots: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each lane with every job running in it (oldest first) and its start, as the runner shows a lane of slots."""
    lanes: dict[str, dict[str, Any]] = {}
    for lane in sorted(used | {r["lane"] for r in running}):
        runs = sorted((r for r in running if r["lane"] == lane), key=lambda r: r["started"])
        view: dict[str, Any] = {
            "state": "running" if runs else "idle",
            "running": [r["job"] for r in runs],
            "started": [r["started"] for r in runs],
            "busy": len(runs),
            "since": runs[0]["started"] if runs else None,
        }
        if lane in slots:
            view["slots"] = slots[lane]
        lanes[lane] = view
    return lanes


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
