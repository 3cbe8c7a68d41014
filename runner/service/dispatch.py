"""Scheduling as a tick does it: facts gathered, the pure scheduler's decision, its actions carried out in order.

A sweep (the timer's tick) judges queued jobs in name order for at most --sweep-budget of CPU-bound work, and
the next sweep goes on where it stopped: a pass over every queued job may take several ticks, and each reason is
at most one pass old (`swept`: when the last whole pass began). A queue judged within the budget is judged whole
in one tick, as one snapshot. Every tick, the sweep's included, gathers each lane's next candidates in the order
they start, as far as the decision needs them (the seed's rule: the first job whose DONE_IF is false and REQUIRES
true): a job's end starts its lane's next job at once, whatever the pass is doing."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from runner import jobfile, procs
from runner.queue import Queue
from runner.records import Parsed, replaced
from runner.runstate import RunnerState
from runner.service.announce import Announcer
from runner.service.facts import Facts, Looking
from runner.service.jobs import Jobs
from runner.service.reasons import Reasons
from runner.service.schedule import (
    Action,
    GpuWait,
    JobFacts,
    Launch,
    More,
    Ready,
    RequiresFalse,
    Skip,
    Snapshot,
    Wait,
    decide,
    decisions,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.service.scan import Scanner

# A sweep judges at least this many queued jobs whatever its budget: a pass always moves on.
SWEEP_MIN = 100


class Dispatcher:
    def __init__(
        self,
        queue: Queue,
        state: RunnerState,
        facts: Facts,
        reasons: Reasons,
        jobs: Jobs,
        announcer: Announcer,
        forget: Callable[[str], None],
    ) -> None:
        self.queue = queue
        self.state = state
        self.facts = facts
        self.reasons = reasons
        self.jobs = jobs
        self.announcer = announcer
        self.forget = forget  # drops everything the runner knows of a job file (it left queue/)
        self._last: tuple[object, ...] | None = None  # what the last decision was made from, when it can recur
        # What the scanner keeps beside the queued jobs' list (runner.service.scan), as the last schedule gave it:
        # the jobs by name, how many per lane, (-PRIORITY, name) of those whose PRIORITY header is not 0, sorted
        self.taken: Mapping[str, Parsed] = {}
        self.lanes: Mapping[str, int] = {}
        self.prioritised: Sequence[tuple[int, str]] = ()
        # The sweep's pass: where it goes on (the last name judged; None: the next sweep begins a pass), when the
        # pass in progress began, how many it judged so far, and when the last whole pass began (every reason is
        # at most that old).
        self.sweep_after: str | None = None
        self.pass_began = 0.0
        self.pass_judged = 0
        self.swept: float | None = None
        self.passes = 0  # whole passes: the waits' repeats and the incidents are judged once a pass
        self._cost = 0.0  # seconds a sweep spent per job it judged, the last time it judged more than SWEEP_MIN

    def _sweep(
        self, now: float, queued: list[tuple[str, Parsed]], parked: str, parked_lanes: dict[str, str]
    ) -> tuple[Snapshot, list[Action] | None]:
        """The sweep's share of this tick: queued jobs in name order from where the last one stopped, until the
        budget is spent (at least SWEEP_MIN of them), and every job not judged yet (new files: what changed);
        with each lane's next candidates, as any tick."""
        start = 0 if self.sweep_after is None else _after(queued, self.sweep_after)
        if start == 0:
            self.pass_began, self.pass_judged = now, 0
        budget = self.facts.config.sweep_budget_s
        deadline = time.monotonic() + budget
        # As many as the budget pays for at what a judged job cost last time (its facts, its decision, its
        # reason set), and never past the deadline for the facts alone.
        limit = max(SWEEP_MIN, int(budget / self._cost)) if self._cost else len(queued)
        looking = self.facts.begin(self.state, now)
        known: dict[str, JobFacts] = {}
        end = start
        try:
            for filename, parsed in queued[start:]:
                known[filename] = looking.facts_of(filename, parsed)
                end += 1
                if end - start >= SWEEP_MIN and (end - start >= limit or time.monotonic() >= deadline):
                    break
            self.pass_judged += end - start
            for filename, parsed in queued:
                if filename not in known and filename not in self.reasons:
                    known[filename] = looking.facts_of(filename, parsed)
            whole = len(known) == len(queued)
            if whole:  # every queued job judged in this tick: one snapshot of them all
                self.sweep_after, self.swept, self.passes = None, now, self.passes + 1
            elif end >= len(queued):
                self.sweep_after, self.swept, self.passes = None, self.pass_began, self.passes + 1
            else:
                self.sweep_after = queued[end - 1][0]
            if not whole:
                self._candidates(now, queued, parked, parked_lanes, looking, known)
        finally:
            looking.end()
        if whole:  # the look's stat()s and KNOWN's table (5 MB each at 100,000) let go before the snapshot is built
            facts = [known[filename] for filename, _ in queued]
            del known, looking
            return self.facts.build(facts, self.jobs.running, parked, now, parked_lanes), None
        # The candidates' decision, with this part of the pass after them: a job further down a lane waits for
        # what holds its lane or behind what starts there (the candidates looked until every lane was full).
        facts = [known[name] for name in sorted(known)]
        snapshot = self.facts.build(facts, self.jobs.running, parked, now, parked_lanes)
        return snapshot, [a for a in decide(self.state, snapshot, now) if not isinstance(a, More)]

    def schedule(
        self,
        now: float,
        queued: list[tuple[str, Parsed]],
        kept: Scanner,
        parked: str,
        parked_lanes: dict[str, str] | None = None,
        sweep: bool = True,
    ) -> None:
        """SWEEP: every queued job judged; else each lane's next candidates only. KEPT: what the scanner keeps beside
        QUEUED as jobs come and go (runner.service.scan.Scanner: `taken`, `lanes`, `prioritised`)."""
        self.taken, self.lanes, self.prioritised = kept.taken, kept.lanes, kept.prioritised
        actions: list[Action] | None = None
        began, looked = time.monotonic(), self.facts.looked_at
        if sweep:
            snapshot, actions = self._sweep(now, queued, parked, parked_lanes or {})
        else:
            snapshot, actions = self._candidates(now, queued, parked, parked_lanes or {})
        # The same facts decide the same actions: a tick where nothing changed does nothing more. Not after a
        # tick that launched (a start may have failed and is tried again) or said gpu-wait (it repeats), and
        # what `blocked` reads beyond the snapshot (the manifest, the other states' files) is part of the key.
        # Holds and moves are decided from the state, not the snapshot: they are part of the key too.
        orders = (tuple(sorted(self.state.held)), tuple(sorted(self.state.priority.items())))
        # The queued jobs' facts are kept as their hash and count, not as themselves: at 100,000 queued the facts
        # kept from one tick to the next were 10 MB held beside the next tick's own.
        facts = (hash(snapshot.queued), len(snapshot.queued))
        rest = replaced(snapshot, queued=())
        seen = (facts, rest, self.facts.manifest.key(), self.queue.state_stamp(), len(self.state.waiting_since), orders)
        if seen == self._last:
            return
        # A sweep's actions are carried out as they are decided (at a first tick of 100,000 queued they were two per
        # job, held beside the facts while every job's reason was set: the process's peak); the snapshot less its
        # queued jobs' facts is what an action reads (none reads those).
        recurs = True
        for action in decisions(self.state, snapshot, now) if actions is None else actions:
            self._carry_out(now, action, self.taken, rest)
            recurs = recurs and not isinstance(action, (Launch, GpuWait))
        self._last = seen if recurs else None
        looked = self.facts.looked_at - looked
        if sweep and looked > SWEEP_MIN:
            self._cost = (time.monotonic() - began) / looked

    def _candidates(
        self,
        now: float,
        queued: list[tuple[str, Parsed]],
        parked: str,
        parked_lanes: dict[str, str],
        looking: Looking | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> tuple[Snapshot, list[Action]]:
        """Each lane's first jobs in the order they start, as many as its free slots and one more; where the
        decision says a lane could start another after them (those were done, wait, or in backoff), more of that
        lane's, twice as many each time. Each job's facts are found out once a tick (KNOWN: those found so far,
        with LOOKING, this tick's look, which the caller ends)."""
        config, running = self.facts.config, self.jobs.running
        budget = {}
        for lane in config.lanes:
            if self.lanes.get(lane):  # a lane with no queued job never fills: the loop would read every job
                busy = sum(1 for run in running.values() if run.lane == lane)
                budget[lane] = max(config.slots_of(lane) - busy, 0) + 1
        if known is None:
            known = {}
        ours = looking is None
        if looking is None:
            looking = self.facts.begin(self.state, now)
        try:
            while True:
                facts: list[JobFacts] = []
                taken = dict.fromkeys(budget, 0)
                unseen: set[str] = set()
                full = 0
                for filename, parsed in self.order(queued):
                    lane = parsed.job.lane  # type: ignore[union-attr]  # the scan returns only valid jobs
                    count = taken.get(lane)
                    if count is None:
                        continue
                    if count >= budget[lane]:
                        unseen.add(lane)
                        continue
                    one = known.get(filename)
                    if one is None:
                        one = known[filename] = looking.facts_of(filename, parsed)
                    facts.append(one)
                    taken[lane] = count + 1
                    if count + 1 == budget[lane]:
                        full += 1
                        if full == len(budget):  # every lane has all it is shown: the rest is not looked at
                            unseen.update(budget)
                            break
                snapshot = self.facts.build(facts, running, parked, now, parked_lanes, frozenset(unseen))
                actions = decide(self.state, snapshot, now)
                more = [a.lane for a in actions if isinstance(a, More)]
                if not more:
                    return snapshot, actions
                for lane in more:
                    budget[lane] *= 2
        finally:
            if ours:
                looking.end()

    def order(self, queued: list[tuple[str, Parsed]]) -> Iterable[tuple[str, Parsed]]:
        """QUEUED (in name order) in the order jobs start: the higher priority first (a `plan move`, a PRIORITY
        header), equal ones in name order. Read lazily, as far as the candidates need: what is not 0 comes from
        the scanner's sorted PRIORITY headers and the moves (few; sorted here), merged, never from a sort of every
        queued job (78 ms a job's end at 100,000 queued)."""
        moved = self.state.priority
        if not moved and not self.prioritised:
            return queued
        return _in_order(queued, self.taken, self.prioritised, moved)

    def sweep_view(self) -> dict[str, object]:
        """The pass in progress, for status.json: when it began, how many it judged so far."""
        return {"began": self.pass_began, "judged": self.pass_judged}

    def _carry_out(
        self,
        now: float,
        action: Action,
        taken: Mapping[str, Parsed],
        snapshot: Snapshot,
    ) -> None:
        if isinstance(action, Skip):
            if self.queue.move(action.filename, "queue", "done"):
                self.queue.emit(now, action.filename, "skipped", note="DONE_IF already true")
            self.forget(action.filename)
        elif isinstance(action, Wait):
            self.reasons.set(now, action.filename, action.reason, action.detail, action.blocker)
        elif isinstance(action, Ready):
            self.state.waiting_since.pop(action.filename, None)
        elif isinstance(action, RequiresFalse):
            requires = getattr(taken[action.filename].job, "requires", None) or ""
            self.reasons.requires_false(
                now,
                action.filename,
                requires,
                self.facts.blocked(self.state, action.filename),
            )
        elif isinstance(action, GpuWait):
            self._gpu_wait(now, action.filename, list(action.users or snapshot.gpu_users or ()), action.gpu)
        elif isinstance(action, Launch):
            self._launch(now, action, taken)
        elif not isinstance(action, More):
            self.announcer.forget_gpu_waits()

    def _gpu_wait(self, now: float, filename: str, users: list[procs.GpuUser], gpu: int | None) -> None:
        left_by = self.jobs.left_by(users[0])
        self.reasons.gpu_foreign(now, filename, users[0], left_by, gpu)
        self.announcer.gpu_wait(now, filename, users, left_by, gpu)

    def _launch(self, now: float, action: Launch, taken: Mapping[str, Parsed]) -> None:
        """Candidates start until the lane's free slots are full; the rest wait in `order` behind the last one
        that started (one that could not start leaves its slot to the next)."""
        started: list[str] = []
        for filename in action.candidates:
            job = taken[filename].job
            assert isinstance(job, jobfile.JobFile)
            if len(started) >= action.slots:
                self.reasons.set(now, filename, "order", f"{started[-1]} is ahead of it", started[-1])
            elif self.jobs.start(now, filename, job, action.gpus.get(filename, ())):
                started.append(filename)


def _in_order(
    queued: list[tuple[str, Parsed]],
    taken: Mapping[str, Parsed],
    prioritised: Sequence[tuple[int, str]],
    moved: Mapping[str, int],
) -> Iterator[tuple[str, Parsed]]:
    """QUEUED by priority (a move's, else the header's), then by name: those above 0, then those at 0 (QUEUED's
    own order, the others skipped), then those below 0. TAKEN: QUEUED by name; PRIORITISED: (-PRIORITY, name) of
    the jobs whose header's PRIORITY is not 0, sorted; MOVED: the moves' priorities (jobs not queued among them)."""
    headers = (item for item in prioritised if item[1] not in moved) if moved else prioritised
    moves = sorted((-p, f) for f, p in moved.items() if p and f in taken)
    ahead = heapq.merge(headers, moves)  # (-priority, name) of every queued job whose priority is not 0
    behind: tuple[int, str] | None = None
    for item in ahead:
        if item[0] > 0:
            behind = item
            break
        yield item[1], taken[item[1]]
    for job in queued:
        p = moved.get(job[0])
        if not (job[1].job.priority if p is None else p):  # type: ignore[union-attr]  # queued: valid jobs
            yield job
    if behind is not None:
        yield behind[1], taken[behind[1]]
        for item in ahead:
            yield item[1], taken[item[1]]


def _after(queued: list[tuple[str, Parsed]], name: str) -> int:
    """The index of the first of QUEUED (in name order) whose name sorts after NAME."""
    low, high = 0, len(queued)
    while low < high:
        mid = (low + high) // 2
        if queued[mid][0] <= name:
            low = mid + 1
        else:
            high = mid
    return low
