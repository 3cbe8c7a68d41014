"""The analysis behind `plan report`: where each lane's time went, and why the work that waited waited."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from plancompiler.report.events import KEPT_KINDS, Clock, EventLines, format_ts, local_time, parse_ts
from plancompiler.report.model import JobStats, Liveness, Report, Span
from runner.durations import format_duration
from runner.logs import signature
from runner.readers import event_problem
from runner.views.waiting import cut_middle
from runner.vocab import Event

# The synthetic last event that carries the window to its end: the runner alive now (or down since its
# last sign of life) is the truth after the last event, not nothing.
_NOW = "(now)"


# Events that end a job's attempt (the busy span in seed-format reports, the attempt's duration).
_END = frozenset(
    e.value for e in (Event.DONE, Event.FAILED, Event.RETRY, Event.TIMEOUT, Event.CANCELLED, Event.START_FAILED)
)


# A job's outcome named by the event that decided it; `failed` with why=timeout is a timeout.
_OUTCOME = {
    Event.DONE.value: "done",
    Event.FAILED.value: "failed",
    Event.RETRY.value: "retrying",
    Event.SKIPPED.value: "skipped",
    Event.INVALID.value: "invalid",
    Event.TIMEOUT.value: "timeout",
    Event.CANCELLED.value: "cancelled",
    Event.BLOCKED.value: "blocked",
    Event.START_FAILED.value: "start-failed",
    Event.RECOVERED.value: "requeued",  # put back in the queue (a runner's stop, or its start after a crash)
}


def build_report(
    events: Iterable[dict[str, Any]],
    since: float | None = None,
    until: float | None = None,
    lanes: tuple[str, ...] = ("net", "gpu", "cpu"),
    live: Liveness | None = None,
    skipped: Iterable[str] = (),
    zone: dict[str, Any] | None = None,
) -> Report:
    """The report of EVENTS in file order, read once (they may stream from a file of a million lines): only
    the kinds the analysis reads are kept (each with the event before it, a runner's last sign of life), and the
    silences are found on the way. ValueError for a window that ends before it starts."""
    if since is not None and until is not None and since >= until:
        raise ValueError(
            f"--since {format_ts(since)} is not before --until {format_ts(until)}: the window would be empty"
        )
    left_out = list(skipped)
    items: list[tuple[float, dict[str, Any]]] = []
    silences = _Silences(since, until)
    clock = Clock(zone)
    first: float | None = None
    tail: tuple[float, dict[str, Any]] | None = None
    checked = isinstance(events, EventLines)  # its lines were checked as they were read
    for index, event in enumerate(events, 1):
        problem = None if checked else event_problem(event)
        if problem is not None:
            left_out.append(f"event {index}: {problem}")
            continue
        if _refused(event):
            continue
        at = clock.time(event)
        if at is None:
            left_out.append(f"{event['ts'][:40]!r}: not a time")
            continue
        kind = event.get("event")
        if kind != Event.HEARTBEAT:
            silences.add(at)
        if kind in KEPT_KINDS or first is None:
            if tail is not None:
                items.append(tail)
            items.append((at, event))
            tail = None
        else:
            tail = (at, event)  # kept only if a kept event follows it, or it is the last
        if first is None:
            first = at
    if tail is not None:
        items.append(tail)
    notes = _close_at_now(items, live, until)
    has_lane_events = any(e.get("event") == "lane" for _, e in items)
    spans = _lane_spans(items) if has_lane_events else _inferred_spans(items)
    seen_lanes = list(dict.fromkeys([*lanes, *(s.lane for s in spans)]))
    items = [(t, e) for t, e in items if _NOW not in e]
    start, end = _window(items, since, until, live)
    clipped = _clipped(spans, start, end)
    window = [(t, e) for t, e in items if start <= t <= end]
    jobs = _jobs(window)
    _resolve_requires(clipped, jobs)
    if live is not None and not live.alive:
        notes += _unknown_outcomes(jobs)
    return Report(
        start,
        end,
        clipped,
        jobs,
        _clusters(window),
        silences.top(start, end),
        not has_lane_events,
        [ln for ln in seen_lanes if any(s.lane == ln for s in clipped)] or list(lanes),
        left_out,
        notes,
    )


def _window(
    items: list[tuple[float, dict[str, Any]]], since: float | None, until: float | None, live: Liveness | None
) -> tuple[float, float]:
    """The report's window: --since/--until where given, else the first event and the last one (or now)."""
    start = since if since is not None else (items[0][0] if items else 0.0)
    last = live.now if live is not None else (items[-1][0] if items else 0.0)
    if until is None and since is not None and (items or live is not None) and since > last:  # the end: now or the last
        said = "now" if live is not None else "the last event"
        raise ValueError(f"--since {format_ts(since)} is after {said} ({format_ts(last)}): the window would be empty")
    return start, until if until is not None else last


def _clipped(spans: list[Span], start: float, end: float) -> list[Span]:
    """SPANS cut to the window [START, END]; those outside it left out."""
    clipped = []
    for span in spans:
        a, b = max(span.start, start), min(span.end, end)
        if b > a:
            clipped.append(replace(span, start=a, end=b))
    return clipped


def _unknown_outcomes(jobs: dict[str, Any]) -> list[str]:
    """Jobs running when the runner went down: nobody saw them end, so their outcome is unknown."""
    gone = [name for name, stats in jobs.items() if stats.attempts and not stats.outcome]
    for name in gone:
        jobs[name].outcome = "unknown"
    return [f"  running when the runner went down (outcome unknown): {', '.join(sorted(gone))}"] if gone else []


def _close_at_now(items: list[tuple[float, dict[str, Any]]], live: Liveness | None, until: float | None) -> list[str]:
    """Carry the lanes from the last event to now: as they were if the runner is alive, else down from its last
    sign of life. A synthetic last event does it, so both span builders treat it like any restart."""
    if live is None or not items:
        return []
    last = items[-1][0]
    end = max(last, live.now if until is None else min(until, live.now))
    if live.alive:
        items.append((end, {"event": _NOW, "ts": format_ts(end), _NOW: True}))
        return []
    alive = max(last, min(live.heartbeat or last, end))
    restart = {"event": Event.RUNNER_START.value, "ts": format_ts(end), "_alive_at": alive, "job": "-", _NOW: True}
    items.append((end, restart))
    if live.stopped is not None:  # it stopped cleanly, and put back what it ran: not running since
        return [f"runner: {live.stopped}; not running for {format_duration(live.now - alive)} since"]
    return [
        f"runner: not running; last sign of life {format_ts(alive)}, down {format_duration(live.now - alive)} since"
    ]


def _refused(event: dict[str, Any]) -> bool:
    """A retry or cancel request the runner refused: older runners logged it as if it had been done."""
    if event.get("event") == Event.RETRY and event.get("by") is not None:
        return "nothing to retry" in str(event.get("note", ""))
    if event.get("event") == Event.CANCELLED:
        return "nothing done" in str(event.get("was", ""))
    return False


def _last_alive(event: dict[str, Any], last_ts: float, now: float) -> float:
    """When the previous runner life was last known alive: its last heartbeat (from `runner-start`'s
    `last_alive`) where the runner records it, else its last event (a `heartbeat` event counts)."""
    try:
        at = event.get("_alive_at")
        alive = at if isinstance(at, float) else parse_ts(event["last_alive"]) if event.get("last_alive") else last_ts
    except (ValueError, TypeError):
        alive = last_ts
    return min(max(alive, last_ts), now)


def _cause(event: dict[str, Any]) -> str:
    reason, blocker = event.get("reason", ""), event.get("blocker", "")
    if reason == "exclusive":
        return f"exclusive: held by {blocker}"
    if reason == "gpu-foreign":
        return f"foreign GPU process {blocker}"
    if reason == "requires":
        return f"requires: {blocker}"
    if reason == "blocked":
        return f"blocked: {blocker}"
    return f"{reason}: {blocker}" if blocker else reason


def _holder(event: dict[str, Any]) -> str:
    """What held a waiting lane, as its bar's label says it: the job, the foreign process, the missing file."""
    reason, blocker = event.get("reason", ""), str(event.get("blocker", "") or "")
    if reason == "requires" and blocker:
        return "missing " + cut_middle(blocker.split()[-1], 60)
    return cut_middle(blocker, 60) if blocker else str(reason)


def _lane_spans(items: list[tuple[float, dict[str, Any]]]) -> list[Span]:
    spans: list[Span] = []
    open_: dict[str, Span] = {}
    last_ts: float | None = None
    for ts, event in items:
        kind = event.get("event")
        if kind == "runner-start":
            if last_ts is not None:
                alive = _last_alive(event, last_ts, ts)
                for lane, span in list(open_.items()):
                    span.end = alive
                    spans.append(span)
                    if ts > alive:
                        spans.append(Span(lane, alive, ts, "down", cause="runner down"))
                open_.clear()
        elif kind == "lane":
            lane = event.get("lane", "?")
            if lane in open_:
                open_[lane].end = ts
                spans.append(open_.pop(lane))
            state = event.get("state", "idle")
            if state == "stopped":
                state = "down"
            job = event.get("job", "") if event.get("job") != "-" else ""
            cause = _cause(event) if state == "waiting" else ("runner stopped" if state == "down" else "")
            busy = event.get("busy")
            slots_busy = busy if isinstance(busy, int) and busy > 1 and state == "busy" else 1
            holder = _holder(event) if state == "waiting" else ""
            open_[lane] = Span(lane, ts, ts, state, job, cause, slots_busy=slots_busy, holder=holder)
        last_ts = ts
    for span in open_.values():
        span.end = last_ts if last_ts is not None else span.start
        spans.append(span)
    return [s for s in spans if s.end > s.start]


def _inferred_spans(items: list[tuple[float, dict[str, Any]]]) -> list[Span]:
    """Seed events: busy from start to its end event; gpu-wait until the next gpu start; idle otherwise."""
    spans: list[Span] = []
    lane_of: dict[str, str] = {}
    running: dict[str, tuple[float, str]] = {}  # lane -> (start, job)
    cursor: dict[str, float] = {}
    waiting: dict[str, tuple[float, str]] = {}
    first = items[0][0] if items else 0.0
    last_ts: float | None = None

    def close_idle(lane: str, until: float) -> None:
        since = cursor.get(lane, first)
        if lane in waiting:
            w_start, cause = waiting.pop(lane)
            if since < w_start:
                spans.append(Span(lane, since, w_start, "idle", inferred=True))
            spans.append(Span(lane, max(w_start, since), until, "waiting", cause=cause, inferred=True))
        elif until > since:
            spans.append(Span(lane, since, until, "idle", inferred=True))

    for ts, event in items:
        kind, job = event.get("event"), event.get("job", "")
        if kind == "runner-start" and last_ts is not None:
            alive = _last_alive(event, last_ts, ts)
            for lane, (s, j) in list(running.items()):
                spans.append(Span(lane, s, alive, "busy", j, inferred=True))
                cursor[lane] = alive
            running.clear()
            for lane in set(cursor) | set(lane_of.values()):
                close_idle(lane, alive)
                if ts > alive:
                    spans.append(Span(lane, alive, ts, "down", cause="runner down", inferred=True))
                cursor[lane] = ts
        elif kind == "start":
            lane = event.get("lane", "cpu")
            lane_of[job] = lane
            close_idle(lane, ts)
            running[lane] = (ts, job)
        elif kind in _END and job in lane_of and running.get(lane_of[job], (0.0, ""))[1] == job:
            lane = lane_of[job]
            s, j = running.pop(lane)
            spans.append(Span(lane, s, ts, "busy", j, inferred=True))
            cursor[lane] = ts
        elif kind == "gpu-wait" and "gpu" not in running:
            waiting.setdefault("gpu", (ts, f"foreign GPU process pid {event.get('pid')}"))
        last_ts = ts
    if last_ts is not None:
        for lane, (s, j) in running.items():
            spans.append(Span(lane, s, last_ts, "busy", j, inferred=True))
        for lane in set(cursor) | set(lane_of.values()):
            if lane not in running:
                close_idle(lane, last_ts)
    return [s for s in spans if s.end > s.start]


def _jobs(items: list[tuple[float, dict[str, Any]]]) -> dict[str, JobStats]:
    jobs: dict[str, JobStats] = defaultdict(JobStats)
    started: dict[str, float] = {}
    retried: dict[str, bool] = {}  # the job's last `retry` was the runner's own (not a `plan retry` request)
    for ts, event in items:
        kind, job = event.get("event"), event.get("job", "-")
        if job == "-" or kind not in (Event.START, *_OUTCOME):
            continue
        if kind == Event.RETRY:
            retried[job] = "next_attempt" in event
        stats = jobs[job]
        stats.add_waited(event)
        if kind == Event.START:
            if stats.outcome == "retrying" and retried.get(job):
                stats.retries += 1
            elif stats.attempts and stats.outcome and stats.outcome != "requeued":  # put back: started again
                stats.reruns += 1  # it had ended: run again by a push or `plan retry`, not by its RETRIES
            stats.attempts += 1
            stats.lane = event.get("lane", stats.lane)
            stats.outcome = ""  # running: a later event decides
            started[job] = ts
            continue
        if kind == Event.BLOCKED and job in started:
            continue  # announced while it ran (a stale event): not what became of this attempt
        if kind in _END and job in started:
            took = _took(event, started.pop(job), ts)
            stats.durations.append(took)
            stats.busy_s += took
            active, watched = _seconds(event.get("gpu_active_s")), _seconds(event.get("gpu_watched_s"))
            if active is not None and watched is not None and active <= watched:
                stats.gpu_active_s += active
                stats.gpu_watched_s += watched
        stats.account(event)
        outcome = _OUTCOME[kind]
        if kind == Event.FAILED and (event.get("why") == "timeout" or stats.outcome == "timeout"):
            outcome = "timeout"  # the runner logs `timeout` when it ends the job, then `failed`
        stats.outcome = outcome
    return dict(jobs)


def _seconds(value: object) -> float | None:
    """A count of seconds from an event, or None where it is not one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return None


def _took(event: dict[str, Any], started: float, ts: float) -> float:
    """An attempt's length: the runner's own `duration_s` where it wrote one (a job that ended while the runner
    was down is logged when it comes back, with `ended`), else from `ended`, else from the event's time."""
    if isinstance(event.get("duration_s"), (int, float)):
        return max(0.0, float(event["duration_s"]))
    if event.get("ended"):
        try:
            return max(0.0, local_time(event["ended"], started) - started)
        except (ValueError, OverflowError):
            pass
    return max(0.0, ts - started)


def _resolve_requires(spans: list[Span], jobs: dict[str, JobStats]) -> None:
    """A REQUIRES wait came true later if its job started afterwards, else its job never started (the words say
    the condition's truth: `held` read as `plan hold`)."""
    for span in spans:
        if span.state == "waiting" and span.cause.startswith("requires:"):
            started = span.job and jobs.get(span.job) and jobs[span.job].attempts > 0
            span.cause += " (true later: the job started)" if started else " (the job never started)"


def _clusters(items: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    clusters = [
        {"jobs": e.get("jobs", []), "line": e.get("line", "")}
        for _, e in items
        if e.get("event") == "correlated-failure"
    ]
    if clusters:
        # The runner announces a cluster again as it grows: keep the largest per line.
        best: dict[str, dict[str, Any]] = {}
        for c in clusters:
            key = signature(c["line"], "")
            if key not in best or len(c["jobs"]) > len(best[key]["jobs"]):
                best[key] = c
        return list(best.values())
    groups: dict[str, dict[str, Any]] = {}
    for _, e in items:
        if e.get("event") in ("failed", "retry") and e.get("tail"):
            line = e["tail"][-1]
            group = groups.setdefault(signature(line, e.get("job", "")), {"jobs": [], "line": line})
            if e["job"] not in group["jobs"]:
                group["jobs"].append(e["job"])
    return [g for g in groups.values() if len(g["jobs"]) >= 2]


class _Silences:
    """The longest gaps between consecutive events (heartbeats are not news), found as the events stream by:
    the five longest are kept, the longest first and, of equal ones, the earlier."""

    def __init__(self, since: float | None, until: float | None, top: int = 5) -> None:
        self.since, self.until, self.keep = since, until, top
        self.prev: float | None = None
        self.heap: list[tuple[float, int, float, float]] = []
        self.count = 0

    def add(self, at: float) -> None:
        if (self.since is not None and at < self.since) or (self.until is not None and at > self.until):
            return
        if self.prev is not None:
            self.count += 1
            entry = (at - self.prev, -self.count, self.prev, at)
            if len(self.heap) < self.keep:
                heapq.heappush(self.heap, entry)
            elif entry > self.heap[0]:
                heapq.heapreplace(self.heap, entry)
        self.prev = at

    def top(self, start: float, end: float) -> list[tuple[float, float]]:
        gaps = sorted(self.heap, reverse=True)
        return [(a, b) for _, _, a, b in gaps if b > a and a >= start and b <= end]
