"""Scheduling as a tick does it: facts gathered, the pure scheduler's decision, its actions carried out in order."""

from __future__ import annotations

from collections.abc import Callable

from runner import jobfile, procs
from runner.queue import Queue
from runner.records import Parsed
from runner.runstate import RunnerState
from runner.service.announce import Announcer
from runner.service.facts import Facts
from runner.service.jobs import Jobs
from runner.service.reasons import Reasons
from runner.service.schedule import Action, GpuWait, Launch, Ready, RequiresFalse, Skip, Snapshot, Wait, decide


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

    def schedule(
        self, now: float, queued: list[tuple[str, Parsed]], parked: str, parked_lanes: dict[str, str] | None = None
    ) -> None:
        snapshot = self.facts.snapshot(self.state, queued, self.jobs.running, parked, now, parked_lanes)
        # The same facts decide the same actions: a tick where nothing changed does nothing more. Not after a
        # tick that launched (a start may have failed and is tried again) or said gpu-wait (it repeats), and
        # what `blocked` reads beyond the snapshot (the manifest, the other states' files) is part of the key.
        # Holds and moves are decided from the state, not the snapshot: they are part of the key too.
        orders = (tuple(sorted(self.state.held)), tuple(sorted(self.state.priority.items())))
        seen = (snapshot, self.facts.manifest.key(), self.queue.state_stamp(), len(self.state.waiting_since), orders)
        if seen == self._last:
            return
        jobs = {filename: parsed.job for filename, parsed in queued}
        actions = decide(self.state, snapshot, now)
        for action in actions:
            self._carry_out(now, action, jobs, snapshot)
        recurs = not any(isinstance(a, (Launch, GpuWait)) for a in actions)
        self._last = seen if recurs else None

    def _carry_out(
        self,
        now: float,
        action: Action,
        jobs: dict[str, jobfile.JobFile | jobfile.Invalid],
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
            requires = getattr(jobs[action.filename], "requires", None) or ""
            self.reasons.requires_false(
                now,
                action.filename,
                requires,
                self.facts.blocked(self.state, action.filename),
            )
        elif isinstance(action, GpuWait):
            self._gpu_wait(now, action.filename, list(action.users or snapshot.gpu_users or ()), action.gpu)
        elif isinstance(action, Launch):
            self._launch(now, action, jobs)
        else:
            self.announcer.forget_gpu_waits()

    def _gpu_wait(self, now: float, filename: str, users: list[procs.GpuUser], gpu: int | None) -> None:
        left_by = self.jobs.left_by(users[0])
        self.reasons.gpu_foreign(now, filename, users[0], left_by, gpu)
        self.announcer.gpu_wait(now, filename, users, left_by, gpu)

    def _launch(self, now: float, action: Launch, jobs: dict[str, jobfile.JobFile | jobfile.Invalid]) -> None:
        """Candidates start until the lane's free slots are full; the rest wait in `order` behind the last one
        that started (one that could not start leaves its slot to the next)."""
        started: list[str] = []
        for filename in action.candidates:
            job = jobs[filename]
            assert isinstance(job, jobfile.JobFile)
            if len(started) >= action.slots:
                self.reasons.set(now, filename, "order", f"{started[-1]} is ahead of it", started[-1])
            elif self.jobs.start(now, filename, job, action.gpus.get(filename, ())):
                started.append(filename)
