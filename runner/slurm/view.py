"""`plan status` and `plan logs` on a Slurm host, from Slurm's own clocks and the ledger.

Every running job per lane with its start time (squeue StartTime; a lane's slots are its licence counts),
waits measured from the eligible time, and each attempt's events (runner.slurm.events) recorded once.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from runner import pushlock
from runner.errors import AgentError
from runner.logs import last_line
from runner.queue import Queue, timestamp
from runner.readers import tail
from runner.slurm import ledger as ledger_mod
from runner.slurm.events import attempt_events, blocked, job_key
from runner.slurm.gates import HELD, check_gates, gated_and_held
from runner.slurm.ledger import ACTIVE, FINISHED_BAD, RUNNING
from runner.slurm.query import ControllerDown, conf_of, env_for, live_of, slurm, squeue, state_of, sync
from runner.slurm.rebuild import open_ledger
from runner.slurm.records import Attempt, JobRecord, Ledger, LiveJob
from runner.slurm.retry import SLURM_ENDED, retry_due
from runner.slurm.statusitems import Counts, Lane, Running, SlurmStatus, Waiting
from runner.slurm.wrapper import job_paths
from runner.vocab import Reason

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.query import Live

REASONS = {
    "Dependency": Reason.REQUIRES,
    "DependencyNeverSatisfied": Reason.BLOCKED,
    "Licenses": Reason.EXCLUSIVE,
    "Resources": Reason.LANE_BUSY,
    "Priority": Reason.ORDER,
    "BeginTime": Reason.BACKOFF,
    "JobHeldUser": Reason.PARKED,
    "JobHeldAdmin": Reason.PARKED,
    "ReqNodeNotAvail": Reason.DRAINED,
    # the same, as squeue words it when the scheduler found no node up ("..., DRAINED or reserved for jobs in
    # higher priority partitions": the text before its first comma)
    "Nodes required for job are DOWN": Reason.DRAINED,
    "NodeDown": Reason.DRAINED,
    "PartitionDown": Reason.DRAINED,
    "PartitionInactive": Reason.DRAINED,
    "PartitionNodeLimit": Reason.DRAINED,
}


def _dependency_names(cur: LiveJob, names: dict[str, str]) -> list[str]:
    """The jobs squeue's %E says CUR waits on, by plan/name where the ledger knows them (aftercorr: the same
    element of the producer array)."""
    task = str(cur.id).partition("_")[2]
    waits = []
    for part in cur.dependency.replace(",", ":").split(":"):
        ident = part.split("(")[0]
        if not ident[:1].isdigit():
            continue
        if ident.endswith("_*") and task:
            ident = f"{ident[:-2]}_{task}"
        waits.append(names.get(ident, ident))
    return waits


def _waiting(key: str, record: JobRecord, last: Attempt, cur: LiveJob | None, names: dict[str, str]) -> Waiting:
    reason_text = cur.reason if cur else "BeginTime"
    reason = REASONS.get(reason_text.split(",")[0], Reason.ORDER)
    detail = reason_text
    if reason is Reason.BACKOFF and last.after == "gated":
        reason, detail = Reason.REQUIRES, "its external REQUIRES was false; checked again at the begin time"
    elif cur and cur.restarts:  # Slurm requeued it (node failure, scontrol requeue): Slurm's reason
        begins = f"; eligible again at {timestamp(cur.eligible)}" if cur.eligible else ""
        detail = f"requeued by Slurm ({cur.restarts} times), {reason_text}{begins}"
    elif reason is Reason.BACKOFF:
        after = (last.after or "").upper()
        cause = f" after {after}" if after in SLURM_ENDED else ""
        detail = f"attempt {last.attempt} waits out the retry backoff{cause}"
    blocker = ""
    if cur and cur.dependency not in ("(null)", ""):
        blocker = ", ".join(_dependency_names(cur, names))
        detail += f": {blocker}"
    since = (cur.eligible or cur.submitted if cur else None) or last.submitted
    if since and cur and cur.submitted and since > time.time():  # a begin time ahead: waiting since submitted
        since = cur.submitted
    return Waiting(key, reason.value, record.lane, detail, blocker, since, last.id)


def status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """status.json's shape from squeue and the ledger; attempt starts and ends recorded as events, once."""
    env = env_for(conf_of(request))
    now = time.time()
    live = squeue(env)  # ControllerDown: answered by runner.agent.dispatch
    got = pushlock.lock(root, {"wait_s": 10, "by": "plan status"})
    try:
        ledger, _ = open_ledger(root, live, env)  # rebuilt, under the lock, where it cannot be trusted
        sync(root, ledger, live, env)
        if got.get("locked"):
            # what Slurm ended or the controller kept from its wrapper; the held jobs whose gates hold now
            if retry_due(root, ledger, live, env) + check_gates(root, ledger, live, env, conf_of(request)):
                live = squeue(env)
            _record_events(root, ledger, live)
            ledger_mod.save(root, ledger)
    finally:
        if got.get("locked"):
            pushlock.release_lock()
    return view(root, ledger, live, now, licences(env)).answer()


def _record_events(root: str, ledger: Ledger, live: Live) -> None:
    seen = ledger.seen
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


def lane_slots(ledger: Ledger, totals: dict[str, int]) -> dict[str, int]:
    """Lane -> how many of its jobs can run at once: a lane's slots are its licence counts on Slurm (the fewest
    jobs any of its licences allows). A lane without licences has no count here."""
    slots: dict[str, int] = {}
    for entry in ledger.plans.values():
        for lane, wanted in entry.lanes.items():
            counts = [totals[n] // max(1, int(c)) for n, c in (w.partition(":")[::2] for w in wanted) if n in totals]
            if counts:
                slots[lane] = min(counts)
    return slots


def _running(
    root: str, plan: str, name: str, record: JobRecord, last: Attempt, cur: LiveJob | None, now: float
) -> Running:
    log = job_paths(root, plan, name, "")["log"]
    start = (cur.start if cur else None) or now
    return Running(
        job=job_key(plan, name),
        lane=record.lane,
        started=start,
        slurm_id=last.id,
        attempt=last.attempt,
        elapsed_s=now - start,
        log_size=_size(log),
        log_grew_at=_mtime(log) or now,
        last_line=last_line(log),
        pid=int(cur.job_id) if cur and cur.job_id.isdigit() else None,
    )


def _due(key: str, record: JobRecord, last: Attempt) -> Waiting:
    """A next try its wrapper could not submit (the controller did not answer): kept, never dropped."""
    detail = (
        f"attempt {last.next_attempt or '?'} could not be submitted when attempt {last.attempt} failed (the Slurm "
        "controller did not answer): it is submitted at the next push, status or watch"
    )
    return Waiting(key, Reason.BACKOFF.value, record.lane, detail, "", last.end, last.id)


def _blocked_item(
    item: Waiting, record: JobRecord, jobs: dict[str, JobRecord], live: Live, cur: LiveJob | None
) -> Waiting:
    bad = [d for d in record.deps if state_of(jobs.get(d), live)[0] in FINISHED_BAD]
    said = f" (Slurm: {cur.reason})" if cur and cur.reason not in ("", "None") else ""
    detail = f"its producer {', '.join(bad) or '?'} failed{said}"
    return replace(item, reason=Reason.BLOCKED.value, blocker=", ".join(bad), detail=detail)


def view(root: str, ledger: Ledger, live: Live, now: float, totals: dict[str, int] | None = None) -> SlurmStatus:
    running: list[Running] = []
    queued: list[Waiting] = []
    counts = {"queue": 0, "running": 0, "done": 0, "failed": 0}
    names = {str(a.id): job_key(p, n) for p, n, r in _records(ledger) for a in r.attempts}
    used: set[str] = set()
    for plan, name, record in _records(ledger):
        jobs = ledger.plans[plan].jobs
        state, last = state_of(record, live)
        if last is None:
            continue
        used.add(record.lane)
        cur = live_of(record, last.id, live)
        if last.retry_due is not None and not last.next_id:
            counts["queue"] += 1
            queued.append(_due(job_key(plan, name), record, last))
        elif state in RUNNING:
            counts["running"] += 1
            running.append(_running(root, plan, name, record, last, cur, now))
        elif state in ACTIVE or state == "GATED":
            counts["queue"] += 1
            item = _waiting(job_key(plan, name), record, last, cur, names)
            if cur and cur.reason == HELD and gated_and_held(root, plan, name, record, live):
                item = replace(
                    item,
                    reason=Reason.REQUIRES.value,
                    detail="its external REQUIRES is false: held (no Slurm job runs for it), checked from the "
                    "submit host at every contact and every gate_interval",
                )
            queued.append(item)
        elif state == "COMPLETED":
            counts["done"] += 1
        else:
            counts["failed"] += 1
            if blocked(record, last, jobs, live):
                item = _waiting(job_key(plan, name), record, last, cur, names)
                queued.append(_blocked_item(item, record, jobs, live, cur))
    return SlurmStatus(
        root=root,
        heartbeat=now,
        lanes=_lanes(used, running, lane_slots(ledger, totals or {})),
        running=tuple(running),
        queued=tuple(item if item.since else replace(item, since=now) for item in queued),
        counts=Counts(**counts),
    )


def _records(ledger: Ledger) -> list[tuple[str, str, JobRecord]]:
    return [
        (plan, name, record)
        for plan, entry in sorted(ledger.plans.items())
        for name, record in sorted(entry.jobs.items())
    ]


def _lanes(used: set[str], running: list[Running], slots: dict[str, int]) -> dict[str, Lane]:
    """Each lane with every job running in it (oldest first) and its start, as the runner shows a lane of slots."""
    lanes: dict[str, Lane] = {}
    for lane in sorted(used | {r.lane for r in running}):
        runs = sorted((r for r in running if r.lane == lane), key=lambda r: r.started)
        lanes[lane] = Lane(
            state="running" if runs else "idle",
            running=tuple(r.job for r in runs),
            started=tuple(r.started for r in runs),
            busy=len(runs),
            since=runs[0].started if runs else None,
            slots=slots.get(lane),
        )
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


def logs(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """A Slurm job's log (ROOT/logs/PLAN/NAME.job.log): JOB is PLAN/NAME.job, or NAME.job where one plan has it."""
    job = str(request["job"])
    job = job[: -len(".job")] if job.endswith(".job") else job
    plan, _, name = job.rpartition("/")
    ledger = ledger_mod.load(root)
    plans = [plan] if plan else [p for p, e in ledger.plans.items() if name in e.jobs]
    if len(plans) != 1 or ".." in job or name.startswith("."):
        raise AgentError(
            f"no job {job}.job pushed here"
            if not plans
            else f"{name}.job is in plans {', '.join(sorted(plans))}: name one, as PLAN/{name}.job"
        )
    entry = ledger.plans.get(plans[0])
    record = entry.jobs.get(name) if entry else None
    last = record.current if record else None
    state = {"RUNNING": "running", "COMPLETED": "done"}.get(
        str(last.state if last else None), "queue" if last else None
    )
    path = str(job_paths(root, plans[0], name, "")["log"])

    offset = int(request.get("offset", -1))
    if not os.path.exists(path):
        return {"state": state, "text": "", "offset": 0, "exists": False}
    if offset < 0:
        text, size = tail(path, int(request.get("max_bytes", 65536)))
        lines = text.splitlines()[-int(request.get("lines", 40)) :]
        return {"state": state, "text": "\n".join(lines) + ("\n" if lines else ""), "offset": size, "exists": True}
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(int(request.get("max_bytes", 1 << 20)))
    return {"state": state, "text": data.decode("utf-8", "replace"), "offset": offset + len(data), "exists": True}
