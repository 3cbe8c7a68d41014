"""`plan report`'s lanes on Slurm, from Slurm's own clocks: each attempt's wait (submitted to started) split by
Slurm's reasons, and each lane's state over time as the runner's `lane` events say it, so that per lane busy +
idle + waiting is the report's window.

A lane is busy while one of its jobs runs (`busy`: how many), waiting while none runs and one of its jobs is
pending (the reason Slurm gave, an eligible job's first: Resources, Licenses, Priority ... before Dependency or
BeginTime), idle otherwise. A wait's reasons are those squeue gave each time the ledger was synced (every
status, watch or push contact, runner.slurm.ledger.record_state), placed on Slurm's clocks: before the job's
eligible time it waited on its dependency or begin time (a retry's backoff, a gate's interval), after it on
the reasons seen then, the first from the eligible time on; a wait no contact saw is Slurm's `None` (eligible,
not yet started by the scheduler).
"""

from __future__ import annotations

from typing import Any, Tuple

from runner.slurm.records import Attempt, JobRecord, Ledger

# Reasons of a job that is not yet eligible: it waits for something outside its lane's resources.
BEFORE_ELIGIBLE = ("Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin")
NOT_SEEN = "None"  # Slurm's own word for an eligible job the scheduler has not yet given a reason

Segment = Tuple[str, float, float]  # (reason, from, to)


def waited(record: JobRecord, attempt: Attempt, start: float | None, end: float | None, now: float) -> list[Segment]:
    """ATTEMPT's wait, from its submission until it started (or ended without starting, or NOW while pending),
    as (Slurm reason, from, to) segments."""
    if attempt.submitted is None or attempt.kind == "gated":
        return []
    first, until = attempt.submitted, start if start is not None else end if end is not None else now
    if until <= first:
        return []
    seen = sorted(((r, max(t, first)) for r, t in attempt.waits if t < until), key=lambda w: w[1])
    before = [r for r, _ in seen if r in BEFORE_ELIGIBLE]
    after = [(r, t) for r, t in seen if r not in BEFORE_ELIGIBLE]
    eligible = attempt.eligible if attempt.eligible is not None and first < attempt.eligible < until else None
    if eligible is None and before:  # not eligible until the first other reason was seen (or it started)
        eligible = min([t for _, t in after if t > first] + [until])
    segments: list[Segment] = []
    if eligible is not None:
        default = "BeginTime" if attempt.after or not record.deps else "Dependency"
        segments.append((before[0] if before else default, first, eligible))
        first = eligible
    after = [(r, t) for r, t in after if t < until]
    marks = [(after[0][0] if after else NOT_SEEN, first)] + [(r, t) for r, t in after[1:] if t > first]
    for i, (reason, at) in enumerate(marks):
        to = marks[i + 1][1] if i + 1 < len(marks) else until
        if to > at:
            segments.append((reason, at, to))
    return segments


def totals(segments: list[Segment]) -> dict[str, float]:
    """Seconds per reason."""
    found: dict[str, float] = {}
    for reason, a, b in segments:
        found[reason] = round(found.get(reason, 0.0) + b - a, 3)
    return found


Interval = Tuple[str, str, float, float, str]  # (lane, kind: run or a reason, from, to, job)


def _pick(waiting: list[Interval]) -> Interval:
    """The wait that says why a lane with no job running is idle: an eligible job's reason before the others."""
    return min(waiting, key=lambda w: (w[1] in BEFORE_ELIGIBLE, w[2], w[4]))


def lane_events(intervals: list[Interval], lanes: list[str]) -> list[tuple[float, dict[str, Any]]]:
    """(time, `lane` event fields) at every change of each lane's state over INTERVALS (one sweep through their
    ends), every lane of LANES starting idle at the first moment any interval starts."""
    if not intervals:
        return []
    first = min(i[2] for i in intervals)
    out: list[tuple[float, dict[str, Any]]] = []
    for lane in sorted(set(lanes) | {i[0] for i in intervals}):
        edges = sorted(
            [(i[2], 1, n) for n, i in enumerate(intervals) if i[0] == lane]
            + [(i[3], -1, n) for n, i in enumerate(intervals) if i[0] == lane]
        )
        active: dict[int, Interval] = {}
        last: tuple[Any, ...] | None = None
        out.append((first, {"lane": lane, "state": "idle"}))
        last = ("idle", None, None)
        k = 0
        while k < len(edges):
            t = edges[k][0]
            while k < len(edges) and edges[k][0] == t:
                _, step, n = edges[k]
                if step > 0:
                    active[n] = intervals[n]
                else:
                    active.pop(n, None)
                k += 1
            fields = _state(list(active.values()))
            now = (fields["state"], fields.get("busy"), fields.get("reason"))
            if now != last:
                out.append((t, {"lane": lane, **fields}))
                last = now
    return out


def _state(live: list[Interval]) -> dict[str, Any]:
    runs = [i for i in live if i[1] == "run"]
    if runs:
        return {"state": "busy", "busy": len(runs), "job": min(i[4] for i in runs)}
    if live:
        pick = _pick(live)
        return {"state": "waiting", "reason": pick[1], "job": pick[4]}
    return {"state": "idle"}


def intervals_of(
    ledger: Ledger, plan: str | None, known: Any, now: float
) -> tuple[list[Interval], dict[str, dict[str, float]]]:
    """Every attempt's run and wait as intervals, and each attempt's wait per reason (by `ID:start` mark). KNOWN
    (record, attempt) -> (start, end, started): what is known of its clocks (runner.slurm.events)."""
    intervals: list[Interval] = []
    waits: dict[str, dict[str, float]] = {}
    for name_of_plan, entry in ledger.plans.items():
        if plan is not None and name_of_plan != plan:
            continue
        for name, record in entry.jobs.items():
            key = f"{name_of_plan}/{name}.job"
            for attempt in record.attempts:
                start, end, started = known(record, attempt)
                segments = waited(record, attempt, start if started else None, end, now)
                intervals += [(record.lane, reason, a, b, key) for reason, a, b in segments]
                if segments:
                    waits[f"{attempt.id}"] = totals(segments)
                if started and start is not None:
                    intervals.append((record.lane, "run", start, end if end is not None else now, key))
    return intervals, waits
