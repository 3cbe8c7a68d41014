"""The runner service: its parts wired together; `tick(now)` moves jobs between the queue's states, `start`/`stop`
begin and end one life of it on a queue root (runner.service.loop's `serve` ticks it on a timer and on every
child's exit)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from runner import __version__, jobfile, wrapper
from runner.alerts.book import CAUSE_KINDS
from runner.alerts.engine import Alerts
from runner.config import Config
from runner.controls import ControlHandler
from runner.digest import sha1_hex
from runner.errors import AlreadyRunning as AlreadyRunning  # its home is runner/errors.py
from runner.files import check_root, make_dir, open_file, read_json, read_regular
from runner.queue import STATES, Queue, fresh_status, timestamp
from runner.records import Parsed, replaced
from runner.runstate import RunnerState
from runner.service.announce import Announcer, LaneView
from runner.service.dirwatch import DirWatch
from runner.service.dispatch import Dispatcher
from runner.service.facts import Facts
from runner.service.jobs import Jobs
from runner.service.manifest import Manifest
from runner.service.outcomes import Outcomes, leave_running
from runner.service.pending import PendingInstall
from runner.service.problems import FileProblems
from runner.service.proctable import OsProcesses, Processes
from runner.service.reasons import Reasons
from runner.service.scan import Scanner
from runner.service.statusfile import Snapshot, StatusFile
from runner.vocab import LANE_WAITS, REASON_NAMES, Event

if TYPE_CHECKING:
    from runner.service.metrics import Counts, TickView


FINISHING_GRACE_S = 60.0  # a new life's wait for a last life's wrapper writing an exit record (_end_leftovers)


class Runner:
    def __init__(self, config: Config, processes: Processes | None = None) -> None:
        # Resolved once: jobs run with the root as their working directory, so a relative --root would
        # name their scripts relative to the wrong place.
        # slots: a dict of our own, kept in place as the manifest's lane slots change (every part reads it).
        self.config = config = replaced(
            config, root=Path(os.path.realpath(config.root)), slots=dict(config.slots), gpus=list(config.gpus)
        )
        self.flag_slots = dict(config.slots)  # --slots: wins over what the manifest asks for
        self.flag_gpus = list(config.gpus)  # --gpus: wins over what the manifest asks for
        self.queue = queue = Queue(config.root)
        self.root = str(config.root)
        self.root_id = sha1_hex(os.fsencode(self.root))[:12]  # a root's name is bytes, maybe not UTF-8
        self.instance = os.urandom(4).hex()
        self.pid = os.getpid()  # the process status.json names (`plan watch` checks it is a live runner)
        self.processes = processes or OsProcesses(config.kill_grace_s)
        self.state = RunnerState()
        self.problems = FileProblems(queue)
        self.manifest = Manifest(queue, self.problems)
        self.reasons = Reasons(self.state)
        self.facts = Facts(config, self.root_id, self.manifest, self.processes)
        self.announcer = Announcer(config, queue, self.reasons)
        self.announcer.watch = lambda: self.facts.gpu_watch
        self.outcomes = Outcomes(config, queue, self.state, self.facts, self.announcer)
        self.jobs = Jobs(
            config,
            queue,
            self.state,
            self.processes,
            self.reasons,
            self.announcer,
            self.outcomes,
            f"{self.root_id}:{self.instance}:",
        )
        self.scanner = Scanner(config, queue, self.reasons, self.manifest, self.forget)
        self.controls = ControlHandler(queue, self.state, self.problems, self.jobs, self.forget, self._taken)
        self.alerts = Alerts(self)
        self.controls.on_ack = self.alerts.ack
        self.dispatcher = Dispatcher(
            queue, self.state, self.facts, self.reasons, self.jobs, self.announcer, self.forget
        )
        self.statusfile = StatusFile(queue)
        self.pending = PendingInstall(queue)  # a push's install left pending: finished here, or said to be stuck
        self._queued: list[tuple[str, Parsed]] = []  # what the last scan found (status while an install holds all)
        self.counts: Counts | None = None  # for --metrics: what it counts of the queue, kept while that is unchanged
        self.started_at = 0.0
        self.ticks = 0
        self.sweeps = 0  # the timer's ticks, each judging queued jobs for --sweep-budget (runner.service.dispatch)
        self.swept_at: float | None = None  # when the last whole pass over them began: every reason is at most this old
        self._alerted: tuple[object, ...] | None = None  # what the incidents were last judged with, beyond reasons
        self.watch: DirWatch | None = None  # set by watch_dirs(): scans read only what changed
        self._lock_fds: list[int] = []
        self._deferred: set[str] | None = set()  # queue/ names changed during ticks an install left pending

    # -- one life ------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        check_root(self.root)  # before anything under it is created, read or run (runner.files: check_root)
        self.queue.ensure()
        check_root(self.root)
        self._lock()
        loaded, problems = RunnerState.load(self.queue)
        self.state.adopt(loaded)
        self.started_at = now
        self.processes.adopt_orphans()
        self.queue.emit(
            now,
            "-",
            Event.RUNNER_START.value,
            pid=self.pid,
            version=__version__,
            instance=self.instance,
            last_alive=self._last_alive(),
        )
        self.problems.report(now, "state.json", problems)
        self._end_leftovers(now)
        # Read once the leftovers are gone: a wrapper records an exit only when the job ended by itself (one
        # ended by us records nothing), so a record here is a job that finished while we were down.
        records = {f: r for f in self.queue.jobs("running") if (r := wrapper.read_record(self.queue.exit_record(f)))}
        for filename in self.queue.list_all("running"):
            if filename in records:
                self.outcomes.finish_recorded(now, filename, records[filename])
            else:
                leave_running(self.queue, filename, "queue")
                self.state.refund(filename)
                self.queue.emit(now, filename, Event.RECOVERED.value)
        for name in os.listdir(self.queue.dir("running")):
            if name.startswith(".") and name.endswith(".exit") and name[1:-5] not in records:
                wrapper.clear_record(self.queue.dir("running") / name)  # a record whose job is gone
        live = set(self.queue.list_all("queue")) | set(self.queue.list_all("running"))
        for job in [j for j in (*self.state.held, *self.state.priority) if j not in live]:
            self.state.ended(job)  # held or moved, then removed while the runner was down (a push, by hand)
        self._save_state(now)

    def _end_leftovers(self, now: float) -> None:
        """Processes an earlier life of this root started (by their tag, or in their job's cgroup) end first."""
        leftovers = self.processes.leftovers(self.root_id + ":")
        # A wrapper none of whose job's processes is left has seen its job end by itself: it is writing the exit
        # record, and ending it would leave none (the job, finished, would run again: the kill grace alone was too
        # short on a loaded box). It gets FINISHING_GRACE_S, then is ended as the rest were meanwhile.
        parents = {p.ppid for p in leftovers}
        finishing = [p.pid for p in leftovers if wrapper.is_wrapper(p.cmdline) and p.pid not in parents]
        ended = [p for p in leftovers if p.pid not in finishing]
        if ended:
            self.processes.end([p.pid for p in ended])
        deadline = time.monotonic() + max(self.config.kill_grace_s, FINISHING_GRACE_S)
        while finishing and time.monotonic() < deadline:
            time.sleep(0.01)
            finishing = [pid for pid in finishing if self.processes.alive(pid)]
        if finishing:  # still there after the grace: ended as the rest were
            self.processes.end(finishing)
            ended += [p for p in leftovers if p.pid in finishing]
        if ended:
            pids, cmds = [p.pid for p in ended], [p.cmdline[:200] for p in ended]
            self.queue.emit(
                now, "-", Event.ORPHANS_KILLED.value, why="left by an earlier runner life", pids=pids, cmds=cmds
            )
        if not self.config.cgroup:
            return
        for name in sorted(os.listdir(self.config.cgroup)):
            if name.startswith("job-"):
                killed = self.processes.end_cgroup(os.path.join(self.config.cgroup, name))
                if killed:
                    self.queue.emit(
                        now,
                        name[4:],
                        Event.ORPHANS_KILLED.value,
                        why="left in its cgroup by an earlier runner life",
                        pids=killed,
                        cgroup=True,
                    )

    def _last_alive(self) -> str | None:
        """The previous life's last heartbeat, from the status.json it left (for downtime in `plan report`)."""
        try:
            beat = fresh_status(self.root, read_json(self.queue.status_path))["runner"]["heartbeat"]
            return timestamp(float(beat))
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            return None

    def _lock(self) -> None:
        """One runner per queue root: a second would end the first one's jobs as leftovers of an earlier life.
        Two locks: ROOT/.runner.lock, which names the holder (runner.agent.detach reads it), and the root
        directory itself, which a full disk (no room for the lock file) cannot take away: a start never fails
        for want of space."""
        holder_path = str(self.queue.root / ".runner.lock")
        fds = [os.open(self.queue.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            fds.append(open_file(holder_path, os.O_RDWR | os.O_CREAT))
        except OSError:
            pass  # a full disk: the directory's lock alone
        for fd in fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                for held in fds:
                    os.close(held)
                holder = (read_regular(holder_path) or b"").decode(errors="replace").strip() or "?"
                raise AlreadyRunning(f"another runner (pid {holder}) already serves {self.root}") from None
        self._lock_fds = fds  # held, never closed, for the life of the process
        if len(fds) > 1:
            try:
                os.ftruncate(fds[1], 0)
                os.write(fds[1], f"{os.getpid()}\n".encode())
            except OSError:
                pass  # a full disk: the lock holds without its note

    def release_lock(self) -> None:
        """Let the root go (an in-process runner that a test ends; a real one holds it until it exits)."""
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []

    def watch_dirs(self) -> bool:
        """Watch queue/ and control/ (inotify): a scan then reads only the files that changed, and `serve` wakes
        the moment one lands. False where the kernel gives no watch: every scan reads every file, as before."""
        if self.watch is None:
            make_dir(str(self.queue.root / "control"))
            self.watch = DirWatch.open([str(self.queue.dir("queue")), str(self.queue.dir("control"))])
        return self.watch is not None

    def _changed(self) -> set[str] | None:
        """The queue/ names changed since the last tick; None when not known (no watch, or events were lost)."""
        watch = self.watch
        if watch is None:
            return None
        changed = watch.drain()
        if watch.lost:
            watch.rewatch()  # before the full scan, so nothing that happens during it is missed
            return None
        return changed.get(str(self.queue.dir("queue")), set())

    def stop(self, now: float, why: str = "SIGTERM") -> None:
        """End every job's tree and put the jobs back in queue/ without using an attempt."""
        for run in list(self.jobs.running.values()):
            self.jobs.evict(now, run, "queue", f"runner stopped ({why})", refund=True)
        for lane in self.config.lanes:
            self.announcer.set_lane(now, lane, LaneView("stopped"))
        # A wait on its own lanes (a job it ran, its order) ends with it: listed on, it would name as running a job
        # it has just put back. What it judged of the jobs themselves (requires, held, blocked, ...) still holds.
        for filename, reason in list(self.reasons.items()):
            if reason.reason in LANE_WAITS:
                self.reasons.drop(filename)
        self.queue.emit(now, "-", Event.RUNNER_STOP.value, why=why)
        self._save_state(now)
        self.outcomes.save_history(now)
        self.alerts.stop()  # what is due goes out first, within a deadline
        try:
            self.statusfile.write(self.snapshot(), now, self._queued, force=True)  # each waiting job with its lane
        except OSError:
            pass
        self.queue.close()
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    # -- the tick ------------------------------------------------------------------------------
    def tick(self, now: float, sweep: bool = True) -> None:
        """One tick at NOW. SWEEP (the timer's tick, every --tick; a test's): queued jobs' reasons and stamps judged
        again for --sweep-budget, going on where the last sweep stopped, and status.json and waiting.json written
        where they changed; once a pass has judged every queued job, the waits are re-announced and the incidents
        judged. Otherwise (a job's end, a new file, a control request woke it): only each lane's next candidates are
        judged. Either way a reason is at most one pass old (status.json's `swept` says when that pass began)."""
        # Its moves and events are fsynced once, at its end: after the jobs it starts (a job's end and its
        # lane's next start are in the same tick, and 3 fsyncs between them were a third of that wait).
        with self.queue.synced_after():
            self._tick(now, sweep)

    def _tick(self, now: float, sweep: bool = True) -> None:
        began = time.monotonic()  # for the metrics' tick duration only: the tick's decisions use NOW
        self.ticks += 1
        # First of all: whatever lands after this stays in the watch's queue and wakes `serve` for another tick
        # (a control/ request dropped while this tick runs must not be drained with nothing to read it).
        changed, deferred, self._deferred = self._changed(), self._deferred, set()
        changed = None if changed is None or deferred is None else changed | deferred
        self.queue.reopen_if_rotated()
        self.processes.reap()
        self.manifest.new_tick(now)  # read (and checked) whenever it changes, not only when a reason needs it
        slots = {**self.manifest.slots(), **self.flag_slots}
        if slots != self.config.slots:
            self.config.slots.clear()
            self.config.slots.update(slots)
        gpus = self.flag_gpus or self.manifest.gpus(self.config.gpu_lane)
        if gpus != self.config.gpus:
            self.config.gpus[:] = gpus
        self.controls.tick(now)
        self.jobs.finish_exited(now)
        self.jobs.enforce_timeouts(now)
        self.jobs.sample_memory()
        self.announcer.watch_running(now, self.jobs.running)
        if self.pending.check(now, retry=sweep):  # no job starts from a queue that may hold part of an install:
            self._deferred = changed  # what changed is read once it is finished
            # a live push's: looked for again shortly; a stuck one: each sweep, its lanes and incident say why
            self.scanner.settle_due = None if self.pending.stuck else min(self.scanner.settle_due or 1e18, now + 0.1)
            self.pending.hold_lanes(now, self.announcer, self.jobs, self.config.lanes)
            self._after(now, sweep, self._queued, passed=sweep)  # the incidents on the sweep's clock meanwhile
            return
        if sweep:  # a tick that judges queued jobs for the sweep (not one a pending install held)
            self.sweeps += 1
        self._queued = queued = self.scanner.scan(now, changed)
        passes = self.dispatcher.passes
        self.dispatcher.schedule(now, queued, self.scanner, self.controls.park, self.controls.park_lanes, sweep)
        passed = self.dispatcher.passes != passes  # this tick ended a pass over every queued job
        self.swept_at = self.dispatcher.swept
        if self.jobs.in_lane(self.config.gpu_lane):  # its jobs' GPU engine time: gpu-stalled, status per GPU
            self.facts.observe_gpus(now, self.jobs.running, max_age=1.0)
            self.announcer.gpu_stalls(now, self.jobs.running)
        if passed:  # every waiting job's repeats: once a pass
            self.announcer.waits(now)
        self.announcer.lanes(now, self.jobs.running, queued, self.scanner.generation, sweep, self.scanner.lanes)
        self.announcer.idle(now, self.jobs.running, queued)
        self._after(now, sweep, queued, began, passed)

    def _after(
        self,
        now: float,
        sweep: bool,
        queued: list[tuple[str, Parsed]],
        began: float | None = None,
        passed: bool = False,
    ) -> None:
        """A tick's end: the incidents, state.json, status.json, history, heartbeat event, metrics. BEGAN: when the
        tick began; None where a pending install held it (nothing judged: status.json is not a sweep's, no metrics).
        PASSED: the incidents are judged (a pass over every queued job ended, or the install's hold went on)."""
        # The causes read every waiting job's reason: judged once a pass, and at once where what a cause is made
        # of changed without a job's reason (a park, a failure, a hold, a full disk).
        alerting = (
            self.controls.park,
            tuple(sorted(self.controls.park_lanes.items())),
            self.jobs.disk_full,
            self.pending.stuck,
            tuple(sorted(self.state.held)),
            self.queue.moves.get("failed", 0),
        )
        if passed or alerting != self._alerted:
            self._alerted = alerting
            self.problems.keep(now, "incidents.json", lambda: self.alerts.tick(now, queued))
        self._save_state(now)
        judged = sweep and began is not None  # an install held the tick: no reason was judged
        self.problems.keep(now, "status.json", lambda: self.statusfile.write(self.snapshot(judged), now, queued))
        if sweep:  # on the sweep's clock, as status.json: rewritten at every job's end, its 2,000 jobs were a third
            self.outcomes.save_history(now)  # of the runner's CPU in a run of short jobs (a cache: events say it all)
        if now - self.queue.last_written >= self.config.heartbeat_event_s:
            # Nothing else said we were alive for that long: `plan report` measures downtime from this.
            self.queue.emit(now, "-", Event.HEARTBEAT.value, tick=self.ticks)
        path = self.config.metrics_path
        if path is not None and began is not None:
            from runner.service import metrics  # only with --metrics: a runner without it never loads it

            self.problems.keep(
                now,
                path.name,
                lambda: metrics.write(path, self._metrics(now, queued, time.monotonic() - began, sweep)),
            )

    def _metrics(self, now: float, queued: list[tuple[str, Parsed]], took: float, sweep: bool = True) -> TickView:
        """What --metrics shows of this tick: counts, and a few values per lane and per running job."""
        from runner.service import metrics

        config, running = self.config, list(self.jobs.running.values())
        if self.counts is None:
            self.counts = metrics.Counts()
        waiting = dict(self.reasons.by_reason)
        by_lane = self.counts.by_lane(  # the jobs the last sweep found queued that still wait (each has its reason)
            (self.scanner.generation, len(queued), self.reasons.generation) if sweep else self.counts.lanes_key,
            lambda: (str(getattr(parsed.job, "lane", "")) for name, parsed in queued if name in self.reasons),
        )
        book, delivery = self.alerts.book.open.values(), self.alerts.delivery() or {}
        return metrics.TickView(
            now=now,
            pid=self.pid,
            version=__version__,
            root=self.root,
            started=self.started_at,
            ticks=self.ticks,
            tick_s=took,
            parked=bool(self.controls.park),
            directories={state: self.statusfile.count(state, exact=sweep) for state in STATES},
            lanes=tuple(
                metrics.LaneSlots(lane, config.slots_of(lane), len(self.jobs.in_lane(lane))) for lane in config.lanes
            ),
            running=tuple(metrics.RunningJob(r.filename, r.lane, now - r.started, r.attempt) for r in running),
            queued_by_lane=by_lane,
            waiting_by_reason=waiting,
            events=dict(self.queue.emitted),
            failures=tuple(signature for _, _, signature, _ in self.announcer.failures),
            incidents={kind: sum(i.kind == kind for i in book) for kind in CAUSE_KINDS},
            acked={kind: sum(i.kind == kind and bool(i.acked) for i in book) for kind in CAUSE_KINDS},
            notices=self.alerts.book.sent,
            notify_failed=int(delivery.get("failed_tries") or 0),
            lane_order=tuple(config.lanes),
            reasons=tuple(sorted(REASON_NAMES)),
            looked_at=self.facts.looked_at,
            stats=self.facts.stats,
            sweeps=self.sweeps,
            swept_age_s=now - self.swept_at if self.swept_at is not None else None,
        )

    def snapshot(self, sweep: bool = True) -> Snapshot:
        """What status.json shows of this runner now (the status file reads this value, not the runner); SWEEP: this
        tick is the timer's (it judged queued jobs for the sweep: status.json and waiting.json are written again)."""
        return Snapshot(
            pid=self.pid,
            instance=self.instance,
            root=self.root,
            started_at=self.started_at,
            ticks=self.ticks,
            config=self.config,
            lane_state=dict(self.announcer.lane_state),
            lane_since=dict(self.announcer.lane_since),
            running=tuple(self.jobs.running.values()),
            park=self.controls.park,
            park_lanes=dict(self.controls.park_lanes),
            gpu_unknown=tuple(self.facts.gpu_unknown),
            gpu_seen=self.facts.gpu_seen,
            disk_full=self.jobs.disk_full,
            write_errors=dict(self.problems.write_errors),
            incidents=len(self.alerts.book.open),
            delivery=self.alerts.delivery(),
            leaks=tuple((pid, job) for pid, job in sorted(self.jobs.kept_leaks.items()) if self.processes.alive(pid)),
            reasons=self.reasons,
            scan_generation=self.scanner.generation,
            sweep=sweep,
            swept=self.swept_at,
            sweeping=self.dispatcher.sweep_view(),
            taken=self.scanner.taken,
            manifest_jobs=(self.manifest.get() or {}).get("jobs"),
        )

    def _save_state(self, now: float) -> None:
        self.problems.keep(now, "state.json", lambda: self.state.save(self.queue))

    def forget(self, filename: str) -> None:
        """FILENAME left queue/ (done, cancelled, invalid): nothing about it is kept."""
        self.scanner.forget(filename)
        self.reasons.drop(filename)
        self.state.waiting_since.pop(filename, None)
        if filename not in self.jobs.running:  # started: its hold or move lasts until it ends (a retry keeps it)
            self.state.ended(filename)

    def _taken(self) -> dict[str, jobfile.JobFile]:
        """The settled queued jobs as the last scan took them (a `move` orders one among its lane's)."""
        return {f: p.job for f, p in self.scanner.taken.items() if isinstance(p.job, jobfile.JobFile)}
