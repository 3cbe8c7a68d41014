"""The scheduler: which queued job starts, and why each other one waits — a pure function of what was seen.

`decide(state, snapshot, now)` does no I/O: the facts it needs (DONE_IF and REQUIRES outcomes, what the
manifest says blocks a job, foreign GPU users, what runs in which lane, the park) are gathered first into a
`Snapshot`, and what it returns are `Action`s the runner carries out in order.

A snapshot may hold only the first queued jobs of a lane (`unseen` names such lanes): a job's end looks at each
lane's next candidates in order, not at every job. Where such a lane could still start a job after the ones it
was shown, `decide` says `More(lane)`: the caller gathers the facts of more of its jobs and decides again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple, Union

from runner.procs import GpuUser
from runner.queue import timestamp
from runner.records import Frozen, fill
from runner.runstate import RunnerState


class JobFacts(NamedTuple):
    """What was found about one settled, valid queued job this tick (a tuple: 10 000 are made every tick)."""

    filename: str
    lane: str
    done: bool = False  # its DONE_IF holds already (see Facts.done_holds)
    requires: bool | None = None  # its REQUIRES holds; None where it was not evaluated (in backoff)
    stale: tuple[str, str] | None = None  # (why, blocker): its output is stale and a producer must run again first
    gpus: int = 1  # GPUs it takes, where the gpu lane gives each job its own
    priority: int = 0  # its PRIORITY header (a `plan move` in RunnerState.priority wins)


class Snapshot(Frozen):
    """What `decide` reads, gathered first (a frozen record: runner.records)."""

    __slots__ = (
        "queued",
        "running",
        "lanes",
        "exclusive",
        "gpu_lane",
        "parked",
        "gpu_users",
        "slots",
        "gpus",
        "gpu_taken",
        "parked_lanes",
        "unseen",
    )
    queued: tuple[JobFacts, ...]  # in name order
    running: Mapping[str, tuple[str, ...]]  # lane -> the jobs running there, in start order
    lanes: tuple[str, ...]  # the order lanes pick jobs in
    exclusive: tuple[str, ...]
    gpu_lane: str
    parked: str  # why the queue is parked; '' when it is not
    gpu_users: tuple[GpuUser, ...] | None  # None: not looked for (no gpu job could start)
    slots: Mapping[str, int]  # lane -> jobs it runs at once (1 where not named)
    gpus: tuple[int, ...]  # the GPUs the gpu lane gives its jobs; (): its slots are counted, not GPUs
    gpu_taken: Mapping[int, str]  # GPU -> the job of ours running on it
    parked_lanes: Mapping[str, str]  # lane -> why it alone is parked
    unseen: frozenset[str]  # lanes with queued jobs after those in `queued` (not looked at)

    def __init__(
        self,
        queued: tuple[JobFacts, ...],
        running: Mapping[str, tuple[str, ...]],
        lanes: tuple[str, ...],
        exclusive: tuple[str, ...],
        gpu_lane: str,
        parked: str = "",
        gpu_users: tuple[GpuUser, ...] | None = None,
        slots: Mapping[str, int] | None = None,
        gpus: tuple[int, ...] = (),
        gpu_taken: Mapping[int, str] | None = None,
        parked_lanes: Mapping[str, str] | None = None,
        unseen: frozenset[str] = frozenset(),
    ) -> None:
        fill(self, "queued", queued)
        fill(self, "running", running)
        fill(self, "lanes", lanes)
        fill(self, "exclusive", exclusive)
        fill(self, "gpu_lane", gpu_lane)
        fill(self, "parked", parked)
        fill(self, "gpu_users", gpu_users)
        fill(self, "slots", {} if slots is None else slots)
        fill(self, "gpus", gpus)
        fill(self, "gpu_taken", {} if gpu_taken is None else gpu_taken)
        fill(self, "parked_lanes", {} if parked_lanes is None else parked_lanes)
        fill(self, "unseen", unseen)

    def free(self, lane: str) -> int:
        return self.slots.get(lane, 1) - len(self.running.get(lane, ()))

    def gpu_blocked(self) -> dict[int, GpuUser]:
        """GPU -> the first foreign user that holds it (one whose GPUs are not known holds every one)."""
        blocked: dict[int, GpuUser] = {}
        for user in self.gpu_users or ():
            for device in user.devices or self.gpus:
                blocked.setdefault(device, user)
        return blocked


class _Action(Frozen):
    """Each action is a frozen record (runner.records): equal to an action of its own class with the same fields
    (never to another's: the tests compare lists of them), hashable, immutable, shown as `Name(field=value)`.
    As frozen dataclasses, each generated and compiled six methods at every runner's start: the eight, ~7 % of its
    imports."""

    __slots__ = ()


class Skip(_Action):
    """DONE_IF already true: to done/ without running."""

    __slots__ = ("filename",)
    filename: str

    def __init__(self, filename: str) -> None:
        fill(self, "filename", filename)


class Wait(_Action):
    __slots__ = ("filename", "reason", "detail", "blocker")
    filename: str
    reason: str
    detail: str
    blocker: str

    def __init__(self, filename: str, reason: str, detail: str, blocker: str = "") -> None:
        fill(self, "filename", filename)
        fill(self, "reason", reason)
        fill(self, "detail", detail)
        fill(self, "blocker", blocker)


class RequiresFalse(_Action):
    __slots__ = ("filename",)
    filename: str

    def __init__(self, filename: str) -> None:
        fill(self, "filename", filename)


class Ready(_Action):
    """REQUIRES holds: whatever it waited for is over (its waiting_since is dropped)."""

    __slots__ = ("filename",)
    filename: str

    def __init__(self, filename: str) -> None:
        fill(self, "filename", filename)


class GpuWait(_Action):
    __slots__ = ("filename", "users", "gpu")
    filename: str
    users: tuple[GpuUser, ...]  # the foreign users it waits for, first the one it is said to wait for
    gpu: int | None  # the GPU they hold, where the lane gives each job its own

    def __init__(self, filename: str, users: tuple[GpuUser, ...] = (), gpu: int | None = None) -> None:
        fill(self, "filename", filename)
        fill(self, "users", users)
        fill(self, "gpu", gpu)


class Launch(_Action):
    """Start the first SLOTS of CANDIDATES that can be started; those after them wait (`order`) behind them."""

    __slots__ = ("lane", "candidates", "slots", "gpus")
    lane: str
    candidates: tuple[str, ...]
    slots: int
    gpus: Mapping[str, tuple[int, ...]]  # candidate -> the GPUs it was given

    def __init__(
        self, lane: str, candidates: tuple[str, ...], slots: int = 1, gpus: Mapping[str, tuple[int, ...]] | None = None
    ) -> None:
        fill(self, "lane", lane)
        fill(self, "candidates", candidates)
        fill(self, "slots", slots)
        fill(self, "gpus", {} if gpus is None else gpus)


class ForgetGpuWaits(_Action):
    """No foreign GPU user is left: their repeats end."""

    __slots__ = ()


class More(_Action):
    """LANE could start a job after the ones the snapshot shows of it, and has more queued: show more of them."""

    __slots__ = ("lane",)
    lane: str

    def __init__(self, lane: str) -> None:
        fill(self, "lane", lane)


Action = Union[Skip, Wait, RequiresFalse, Ready, GpuWait, Launch, ForgetGpuWaits, More]


class _Lanes:
    """What holds each lane as the decision proceeds: running jobs, then the launches decided this tick."""

    __slots__ = ("held", "launches", "gpu_free", "gpu_given", "gpu_kept")

    def __init__(self, held: dict[str, str]) -> None:
        self.held = held  # lane -> a job that holds it (for `exclusive`)
        self.launches: dict[str, list[str]] = {}
        self.gpu_free: list[int] = []  # GPUs neither running a job of ours nor held by a foreign user
        self.gpu_given: dict[str, tuple[int, ...]] = {}  # job -> the GPUs it starts on
        self.gpu_kept: dict[int, str] = {}  # GPU -> the waiting job it is kept for


def decide(state: RunnerState, snapshot: Snapshot, now: float) -> list[Action]:
    return list(decisions(state, snapshot, now))


def decisions(state: RunnerState, snapshot: Snapshot, now: float) -> Iterator[Action]:
    """`decide`'s actions one at a time, in the same order: a caller that carries each out as it comes never holds
    them all (two per queued job at a first tick of 100,000: 10 MB). Each job is judged from the snapshot and
    STATE's hold, backoff and priority as they are when its turn comes; carrying out a job's actions changes
    none of another's, and a lane's Launch comes after all of its jobs are judged."""
    lanes = _Lanes({lane: jobs[0] for lane, jobs in snapshot.running.items() if jobs})
    blocked = snapshot.gpu_blocked()
    lanes.gpu_free = [d for d in snapshot.gpus if d not in snapshot.gpu_taken and d not in blocked]
    ordered = in_order(snapshot.queued, state.priority)
    for lane in snapshot.lanes:
        for facts in (f for f in ordered if f.lane == lane):
            yield from _one(state, snapshot, lanes, facts, now)
        if lane in lanes.launches:
            if lane == snapshot.gpu_lane and snapshot.gpus:
                names = tuple(lanes.launches[lane])
                yield Launch(lane, names, len(names), {n: lanes.gpu_given[n] for n in names})
            else:
                yield Launch(lane, tuple(lanes.launches[lane]), snapshot.free(lane))
        if lane in snapshot.unseen and _room(snapshot, lanes, lane):
            yield More(lane)
    if snapshot.gpu_users is not None and not snapshot.gpu_users:
        yield ForgetGpuWaits()


def _one(state: RunnerState, snapshot: Snapshot, lanes: _Lanes, facts: JobFacts, now: float) -> list[Action]:
    """The actions for one queued job, in the order its checks are made (the first that holds it wins)."""
    name, lane = facts.filename, facts.lane
    held = state.held.get(name)
    if held is not None:  # first: nothing is judged of a held job, nothing starts it
        return [Wait(name, "held", f"held by {held.get('by', '?')} since {held.get('since', '?')}")]
    if facts.done:
        return [Skip(name)]
    if facts.stale is not None:
        return [Wait(name, "stale", *facts.stale)]
    until = state.backoff_until.get(name, 0)
    if until > now:
        return [Wait(name, "backoff", f"retry at {timestamp(until)}")]
    if not facts.requires:
        return [RequiresFalse(name)]
    if lane == snapshot.gpu_lane and snapshot.gpus:
        return _on_gpus(snapshot, lanes, facts)
    if lane in lanes.launches:
        lanes.launches[lane].append(name)  # starts in a free slot, or waits in `order` behind those that did
        return [Ready(name)]
    hold = _held(snapshot, lanes, lane)
    if hold is not None:
        return [Ready(name), Wait(name, *hold)]
    if lane == snapshot.gpu_lane and snapshot.gpu_users:
        return [Ready(name), GpuWait(name, snapshot.gpu_users)]
    lanes.launches[lane] = [name]
    lanes.held.setdefault(lane, name)
    return [Ready(name)]


def _on_gpus(snapshot: Snapshot, lanes: _Lanes, facts: JobFacts) -> list[Action]:
    """A gpu job where the lane gives each job its own GPUs: it starts on the first free ones, or waits for
    foreign users (`gpu-foreign`, naming the GPU) or for our own jobs (`lane-busy`: the GPUs that free up meanwhile
    are kept for it, so that a job asking for two is not passed for ever by jobs asking for one)."""
    name, need, lane = facts.filename, facts.gpus, facts.lane
    if need > len(snapshot.gpus):
        have = ",".join(map(str, snapshot.gpus))
        return [
            Ready(name),
            Wait(name, "blocked", f"asks for {need} GPUs; this runner has {len(snapshot.gpus)} ({have})"),
        ]
    hold = _held(snapshot, lanes, lane, slots=False)
    if hold is not None:
        return [Ready(name), Wait(name, *hold)]
    free = lanes.gpu_free
    if len(free) >= need:
        lanes.gpu_given[name] = tuple(free[:need])
        del free[:need]
        lanes.launches.setdefault(lane, []).append(name)
        lanes.held.setdefault(lane, name)
        return [Ready(name)]
    blocked = snapshot.gpu_blocked()
    foreign = [d for d in snapshot.gpus if d in blocked and d not in snapshot.gpu_taken]
    if foreign and len(free) + len(foreign) >= need:
        users = (blocked[foreign[0]], *(u for u in snapshot.gpu_users or () if u is not blocked[foreign[0]]))
        return [Ready(name), GpuWait(name, users, foreign[0])]
    for device in free[:need]:
        lanes.gpu_kept[device] = name
    del free[:need]
    taken = dict(snapshot.gpu_taken)  # ours: running, or starting this tick
    taken.update((d, job) for job, given in lanes.gpu_given.items() for d in given)
    busy = [(d, f"GPU {d}: {j} runs") for d, j in taken.items()]
    busy += [(d, f"GPU {d} kept for {j}") for d, j in lanes.gpu_kept.items() if j != name]
    if not busy and snapshot.gpu_users:  # every GPU held by foreign users
        return [Ready(name), GpuWait(name, tuple(snapshot.gpu_users), foreign[0] if foreign else None)]
    busy.sort()
    first = (taken.get(busy[0][0]) or lanes.gpu_kept[busy[0][0]]) if busy else ""
    s_ = "s" if need > 1 else ""
    detail = f"needs {need} GPU{s_}; " + ", ".join(text for _, text in busy)
    return [Ready(name), Wait(name, "lane-busy", detail, first)]


def _held(snapshot: Snapshot, lanes: _Lanes, lane: str, slots: bool = True) -> tuple[str, str, str] | None:
    """(reason, detail, blocker) when something outside the job holds its lane."""
    if slots and snapshot.free(lane) <= 0:
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
    if lane in snapshot.parked_lanes:
        return "parked", snapshot.parked_lanes[lane], ""
    return None


def _room(snapshot: Snapshot, lanes: _Lanes, lane: str) -> bool:
    """LANE could start one more job after the jobs decided so far (its slots or GPUs, its holds)."""
    if lane == snapshot.gpu_lane and snapshot.gpus:
        return bool(lanes.gpu_free) and _held(snapshot, lanes, lane, slots=False) is None
    if len(lanes.launches.get(lane, ())) >= snapshot.free(lane) or _held(snapshot, lanes, lane) is not None:
        return False
    return not (lane == snapshot.gpu_lane and snapshot.gpu_users)


def priority_of(facts: JobFacts, moved: Mapping[str, int]) -> int:
    """A queued job's priority: as `plan move` set it, else its PRIORITY header (0 by default)."""
    return moved.get(facts.filename, facts.priority)


def in_order(queued: tuple[JobFacts, ...], moved: Mapping[str, int]) -> tuple[JobFacts, ...]:
    """QUEUED (in name order) in the order they start: the higher priority first, equal ones in name order."""
    if not moved and not any(f.priority for f in queued):
        return queued  # the common case: every priority 0, the name order as it is
    return tuple(sorted(queued, key=lambda f: -priority_of(f, moved)))  # stable: names order equal priorities
