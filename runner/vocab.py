"""Contract 3's closed vocabularies, defined once: event names and the reasons a queued job waits.

Everything that writes or reads events.jsonl or status.json (the runner, the host agent, and the
plan side's watch, report and `plan run`) imports these; nobody keeps a literal list of its own.
"""

from __future__ import annotations

from enum import Enum


class Event(str, Enum):
    """An events.jsonl `event` name. Seed names first, with their seed fields kept."""

    RUNNER_START = "runner-start"
    START = "start"
    DONE = "done"
    FAILED = "failed"
    RETRY = "retry"
    RECOVERED = "recovered"
    SKIPPED = "skipped"
    GPU_WAIT = "gpu-wait"
    REQUIRES_WAIT = "requires-wait"
    INVALID = "invalid"
    BLOCKED = "blocked"
    TIMEOUT = "timeout"
    LONG_RUNNING = "long-running"
    STALLED = "stalled"
    ORPHANS_KILLED = "orphans-killed"
    IDLE = "idle"
    CORRELATED_FAILURE = "correlated-failure"
    LANE = "lane"
    RUNNER_STOP = "runner-stop"
    PARKED = "parked"
    UNPARKED = "unparked"
    CANCELLED = "cancelled"
    STATE_CORRUPT = "state-corrupt"
    START_FAILED = "start-failed"
    HEARTBEAT = "heartbeat"
    GPU_STALLED = "gpu-stalled"
    INCIDENT = "incident"  # the incident book opened, repeated or recovered an incident (runner.alerts.book)
    INSTALL_STUCK = "install-stuck"  # a push's pending install cannot be finished: no job starts (once per cause)
    INSTALL_FINISHED = "install-finished"  # the runner finished an install its push left, or a stuck one ended

    def __str__(self) -> str:
        return self.value


class Reason(str, Enum):
    """Why a queued job is not running (status.json `reason`), like Slurm's pending REASON."""

    REQUIRES = "requires"
    BLOCKED = "blocked"
    LANE_BUSY = "lane-busy"
    EXCLUSIVE = "exclusive"
    GPU_FOREIGN = "gpu-foreign"
    BACKOFF = "backoff"
    ORDER = "order"
    PARKED = "parked"
    SETTLING = "settling"
    DISK_FULL = "disk-full"
    STALE = "stale"
    DRAINED = "drained"  # on Slurm: no node it may run on takes jobs now (drained, down, partition down)
    HELD = "held"  # `plan hold`: kept from starting until `plan release`
    # A lane's reason only (status.json `lanes`): a push's install is pending and cannot be finished, and no job
    # starts until it is (runner.service.pending); its blocker is the error.
    INSTALL_PENDING = "install-pending"

    def __str__(self) -> str:
        return self.value


EVENT_NAMES = frozenset(e.value for e in Event)
# A lane's reasons that no queued job carries (status.json `lanes` only)
LANE_REASONS = frozenset({Reason.INSTALL_PENDING.value})
REASON_NAMES = frozenset(r.value for r in Reason) - LANE_REASONS  # what a queued job may wait on
# Reasons that are the queue working as designed, or as its operator asked (a held job): a job waiting for them is
# not an incident.
ORDINARY_REASONS = frozenset({Reason.ORDER.value, Reason.LANE_BUSY.value, Reason.HELD.value})
# Waits on the runner's own lanes: for a job it runs (lane-busy, exclusive) or one before it in its order. They end
# with the runner (runner.service.runner.stop): no queued job waits on them once it has stopped.
LANE_WAITS = frozenset({Reason.LANE_BUSY.value, Reason.EXCLUSIVE.value, Reason.ORDER.value})
