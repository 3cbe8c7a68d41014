"""The scheduler: which queued job starts, and why each other one waits — a pure function of what was seen.

`decide(state, snapshot, now)` does no I/O: the facts it needs (DONE_IF and REQUIRES outcomes, what the
manifest says blocks a job, foreign GPU users, what runs in which lane, the park) are gathered first into a
`Snapshot`, and what it returns are `Action`s the runner carries out in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from runner.procs import GpuUser
from runner.queue import timestamp
from runner.runstate import RunnerState


class JobFacts(NamedTuple):
    """What was found about one settled, valid queued job this tick (a tuple: 10 000 are made every tick)."""

    filename: str
    lane: str
    done: bool = False  # its DONE_IF holds already (see Facts.done_holds)
    requires: bool | None = None  # its REQUIRES holds; None where it was not evaluated (in backoff)
    stale: tuple[str, str] | None = None  # (why, blocker): its output is stale and a producer must run again first


@dataclass(frozen=True)
class Snapshot:
    queued: tuple[JobFacts, ...]  # in name order
    running: Mapping[str, tuple[str, ...]]  # lane -> the jobs running there, in start order
    lanes: tuple[str, ...]  # the order lanes pick jobs in
    exclusive: tuple[str, ...]
    gpu_lane: str
    parked: str = ""  # why the queue is parked; '' when it is not
    gpu_users: tuple[GpuUser, ...] | None = None  # None: not looked for (no gpu job could start)
    slots: Mapping[str, int] = field(default_factory=dict)  # lane -> jobs it runs at once (1 where not named)

    def free(self, lane: str) -> int:
        return self.slots.get(lane, 1) - len(self.running.get(lane, ()))


@dataclass(frozen=True)
class Skip:
    """DONE_IF already true: to done/ without running."""

    filename: str


@dataclass(frozen=True)
class Wait:
    filename: str
    reason: str
    detail: str
    blocker: str = ""


@dataclass(frozen=True)
class RequiresFalse:
    filename: str


@dataclass(frozen=True)
class Ready:
    """REQUIRES holds: whatever it waited for is over (its waiting_since is dropped)."""

    filename: str


@dataclass(frozen=True)
class GpuWait:
    filename: str


@dataclass(frozen=True)
class Launch:
    """Start the first SLOTS of CANDIDATES that can be started; those after them wait (`order`) behind them."""

    lane: str
    candidates: tuple[str, ...]
    slots: int = 1


@dataclass(frozen=True)
class ForgetGpuWaits:
    """No foreign GPU user is left: their repeats end."""


Action = Skip | Wait | RequiresFalse | Ready | GpuWait | Launch | ForgetGpuWaits


@dataclass
class _Lanes:
    """What holds each lane as the decision proceeds: running jobs, then the launches decided this tick."""

    held: dict[str, str]  # lane -> a job that holds it (for `exclusive`)
    launches: dict[str, list[str]] = field(default_factory=dict)


def decide(state: RunnerState, snapshot: Snapshot, now: float) -> list[Action]:
    lanes = _Lanes({lane: jobs[0] for lane, jobs in snapshot.running.items() if jobs})
    actions: list[Action] = []
    for lane in snapshot.lanes:
        for facts in (f for f in snapshot.queued if f.lane == lane):
            actions.extend(_one(state, snapshot, lanes, facts, now))
        if lane in lanes.launches:
            actions.append(Launch(lane, tuple(lanes.launches[lane]), snapshot.free(lane)))
    if snapshot.gpu_users is not None and not snapshot.gpu_users:
        actions.append(ForgetGpuWaits())
    return actions


def _one(state: RunnerState, snapshot: Snapshot, lanes: _Lanes, facts: JobFacts, now: float) -> list[Action]:
    """The actions for one queued job, in the order its checks are made (the first that holds it wins)."""
    name, lane = facts.filename, facts.lane
    if facts.done:
        return [Skip(name)]
    if facts.stale is not None:
        return [Wait(name, "stale", *facts.stale)]
    until = state.backoff_until.get(name, 0)
    if until > now:
        return [Wait(name, "backoff", f"retry at {timestamp(until)}")]
    if not facts.requires:
        return [RequiresFalse(name)]
    if lane in lanes.launches:
        lanes.launches[lane].append(name)  # starts in a free slot, or waits in `order` behind those that did
        return [Ready(name)]
    hold = _held(snapshot, lanes, lane)
    if hold is not None:
        return [Ready(name), Wait(name, *hold)]
    if lane == snapshot.gpu_lane and snapshot.gpu_users:
        return [Ready(name), GpuWait(name)]
    lanes.launches[lane] = [name]
    lanes.held.setdefault(lane, name)
    return [Ready(name)]


def _held(snapshot: Snapshot, lanes: _Lanes, lane: str) -> tuple[str, str, str] | None:
    """(reason, detail, blocker) when something outside the job holds its lane."""
    if snapshot.free(lane) <= 0:
        held = snapshot.running[lane]
        if len(held) == 1:
            return "lane-busy", f"{held[0]} is running in {lane}", held[0]
        return "lane-busy", f"{', '.join(held)} fill the {len(held)} slots of {lane}", held[0]
    if lane in snapshot.exclusive:
        for other in snapshot.exclusive:
            if other != lane and other in lanes.held:
                holder = lanes.held[other]
                return "exclusive", f"{holder} holds exclusive lane {other}", holder
    if snapshot.parked:
        return "parked", snapshot.parked, ""
    return None
