"""`runner run --metrics FILE`: the queue as Prometheus text, rewritten atomically every tick (for node_exporter's
textfile collector, which reads every `*.prom` file of its directory). Standard library only.

A tick's cost stays independent of the queue's size: the per-reason and per-lane counts of waiting jobs are
counted again only when a reason or the queue changed (their generations), as status.json's entries are; the
rest is a handful of values per lane and per running job.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.files import atomic_write

# Failure signatures exported: the most frequent ones within the correlation window (a label's values are bounded).
TOP_SIGNATURES = 10
_NAME_OK = re.compile(r"[^a-zA-Z0-9_:]")


@dataclass(frozen=True)
class RunningJob:
    job: str
    lane: str
    age_s: float
    attempt: int


@dataclass(frozen=True)
class LaneSlots:
    lane: str
    slots: int
    busy: int


@dataclass(frozen=True)
class TickView:
    """What one tick knows that the metrics show; the service fills it from its parts."""

    now: float
    pid: int
    version: str
    root: str
    started: float
    ticks: int
    tick_s: float  # how long the last tick took
    parked: bool
    directories: dict[str, int]  # queue/ running/ done/ failed/ -> files in it
    lanes: tuple[LaneSlots, ...]
    running: tuple[RunningJob, ...]
    queued_by_lane: dict[str, int]
    waiting_by_reason: dict[str, int]
    events: dict[str, int]  # events written since the runner started, by name
    failures: tuple[str, ...]  # each recent failure's signature (within the correlation window)
    incidents: dict[str, int]  # the incident book's open incidents, by kind (runner.alerts.book)
    acked: dict[str, int]  # of those, how many are acked
    notices: int  # notices the book has given out (opens, repeats, recoveries)
    notify_failed: int  # deliveries of notices that failed (each try), with --notify
    lane_order: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()  # every reason name, so each has a series (0 when none waits on it)
    looked_at: int = 0  # queued jobs whose facts (DONE_IF, stamp, REQUIRES) ticks found out
    stats: int = 0  # stat() calls made for conditions' paths
    sweeps: int = 0  # the timer's ticks, each judging queued jobs for --sweep-budget
    swept_age_s: float | None = None  # how long ago the last whole pass over every queued job began


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render(view: TickView) -> str:
    """The Prometheus text exposition (version 0.0.4) of VIEW."""
    out: list[str] = []
    for family in _families(view):
        out.append(f"# HELP {family.name} {family.help}")
        out.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            text = ",".join(f'{_NAME_OK.sub("_", k)}="{_escape(v)}"' for k, v in labels.items())
            out.append(f"{family.name}{{{text}}} {_number(value)}" if text else f"{family.name} {_number(value)}")
    return "\n".join(out) + "\n"


def _families(view: TickView) -> list[_Family]:
    info = _Family("plan_runner_info", "gauge", "The runner serving this queue root (always 1).")
    info.add(1, version=view.version, pid=str(view.pid), root=view.root)
    start = _Family("plan_runner_start_time_seconds", "gauge", "When this runner started, in Unix time.")
    start.add(view.started)
    beat = _Family("plan_runner_heartbeat_timestamp_seconds", "gauge", "The runner's last tick, in Unix time.")
    beat.add(view.now)
    ticks = _Family("plan_runner_ticks_total", "counter", "Ticks since the runner started.")
    ticks.add(view.ticks)
    took = _Family("plan_runner_tick_duration_seconds", "gauge", "How long the runner's last tick took.")
    took.add(view.tick_s)
    parked = _Family("plan_runner_parked", "gauge", "1 while the queue is parked (no job starts), else 0.")
    parked.add(1 if view.parked else 0)
    directories = _Family("plan_queue_files", "gauge", "Job files in each state directory of the queue root.")
    for state, count in view.directories.items():
        directories.add(count, state=state)
    jobs = _Family("plan_jobs", "gauge", "Jobs queued and running, by state and lane.")
    running_by_lane = Counter(run.lane for run in view.running)
    lanes = list(view.lane_order) + sorted(
        {*running_by_lane, *view.queued_by_lane, *(s.lane for s in view.lanes)} - set(view.lane_order)
    )
    for lane in lanes:
        jobs.add(view.queued_by_lane.get(lane, 0), state="queued", lane=lane)
        jobs.add(running_by_lane.get(lane, 0), state="running", lane=lane)
    waiting = _Family("plan_jobs_waiting", "gauge", "Queued jobs by the reason they are not running.")
    for reason in sorted({*view.reasons, *view.waiting_by_reason}):
        waiting.add(view.waiting_by_reason.get(reason, 0), reason=reason)
    slots = _Family("plan_lane_slots", "gauge", "Jobs a lane may run at once.")
    busy = _Family("plan_lane_busy_slots", "gauge", "Slots of a lane running a job now.")
    for lane_slots in view.lanes:
        slots.add(lane_slots.slots, lane=lane_slots.lane)
        busy.add(lane_slots.busy, lane=lane_slots.lane)
    age = _Family("plan_job_running_seconds", "gauge", "How long each running job has run (this attempt).")
    attempt = _Family("plan_job_attempt", "gauge", "The attempt each running job is on (1 for its first).")
    for run in view.running:
        age.add(round(run.age_s, 1), job=run.job, lane=run.lane)
        attempt.add(run.attempt, job=run.job, lane=run.lane)
    events = _Family("plan_events_total", "counter", "Events written since the runner started, by event name.")
    for name, count in sorted(view.events.items()):
        events.add(count, event=name)
    failures = _Family(
        "plan_recent_failures",
        "gauge",
        f"Failed attempts within the correlation window by failure signature (the {TOP_SIGNATURES} most frequent).",
    )
    for signature, count in Counter(view.failures).most_common(TOP_SIGNATURES):
        failures.add(count, signature=signature[:200])
    signatures = _Family(
        "plan_recent_failure_signatures", "gauge", "Distinct failure signatures within the correlation window."
    )
    signatures.add(len(set(view.failures)))
    incidents = _Family("plan_incidents_open", "gauge", "Open incidents of the runner's incident book, by kind.")
    acked = _Family("plan_incidents_acked", "gauge", "Open incidents that are acked, by kind.")
    for kind, count in sorted(view.incidents.items()):
        incidents.add(count, kind=kind)
        acked.add(view.acked.get(kind, 0), kind=kind)
    notices = _Family(
        "plan_notices_total", "counter", "Notices the incident book gave out (opens, repeats, recoveries)."
    )
    notices.add(view.notices)
    failed = _Family("plan_notify_failed_tries_total", "counter", "Deliveries of notices (--notify) that failed.")
    failed.add(view.notify_failed)
    looked = _Family(
        "plan_runner_jobs_judged_total", "counter", "Queued jobs whose DONE_IF, stamp and REQUIRES ticks judged."
    )
    looked.add(view.looked_at)
    stats = _Family("plan_runner_condition_stats_total", "counter", "stat() calls made for conditions' paths.")
    stats.add(view.stats)
    sweeps = _Family("plan_runner_sweeps_total", "counter", "Sweeps (each judges queued jobs for --sweep-budget).")
    sweeps.add(view.sweeps)
    swept = _Family("plan_runner_sweep_age_seconds", "gauge", "How long ago every queued job's reason was last judged.")
    if view.swept_age_s is not None:
        swept.add(round(view.swept_age_s, 3))
    return [
        info,
        start,
        beat,
        ticks,
        took,
        parked,
        directories,
        jobs,
        waiting,
        slots,
        busy,
        age,
        attempt,
        events,
        failures,
        signatures,
        incidents,
        acked,
        notices,
        failed,
        looked,
        stats,
        sweeps,
        swept,
    ]


class Counts:
    """Queued jobs by lane, counted again only when what they count changed: a tick's cost stays apart from the
    queue's size (waiting jobs by reason are counted as reasons change: runner.service.reasons)."""

    def __init__(self) -> None:
        self._lanes_key: Any = None
        self._by_lane: dict[str, int] = {}

    @property
    def lanes_key(self) -> Any:
        """The key the counts by lane were last made for: passed back, they are kept as they are."""
        return self._lanes_key

    def by_lane(self, generation: Any, lanes: Callable[[], Iterable[str]]) -> dict[str, int]:
        if generation != self._lanes_key:
            self._by_lane = dict(Counter(lanes()))
            self._lanes_key = generation
        return self._by_lane


def write(path: Path, view: TickView) -> None:
    """The metrics file replaced whole (a reader never sees half of it), readable by the collector's user (0644);
    not synced: it is rewritten next tick."""
    atomic_write(path, render(view).encode(errors="backslashreplace"), durable=False, mode=0o644)  # a root not UTF-8
