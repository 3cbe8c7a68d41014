"""The runner: `tick(now)` moves jobs between the queue's states; `serve()` calls it on every tick and child exit."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from runner import __version__, jobfile, leaks, procs, stamps, wrapper
from runner.announce import Announcements
from runner.conditions import Condition, evaluate
from runner.config import Config
from runner.controls import Controls
from runner.outcomes import Outcomes
from runner.queue import Queue, read_json, timestamp
from runner.reasons import Reasons
from runner.records import Parsed, Reason, Running
from runner.scan import Scanner
from runner.state import Problem
from runner.vocab import Event
from runner.vocab import Reason as Why


class AlreadyRunning(Exception):
    pass


class Runner(Controls, Reasons, Announcements, Scanner, Outcomes):
    def __init__(self, config: Config) -> None:
        # Resolved once: jobs run with the root as their working directory, so a relative --root would
        # name their scripts relative to the wrong place.
        self.config = config = replace(config, root=Path(config.root).resolve())
        self.queue = Queue(config.root)
        self.root = str(config.root)
        self.root_id = hashlib.sha1(self.root.encode()).hexdigest()[:12]
        self.instance = secrets.token_hex(4)
        self.state: dict[str, Any] = {}
        self.parsed: dict[str, Parsed] = {}
        self.running: dict[str, Running] = {}  # lane -> running job
        self.exited: dict[int, int] = {}  # pid -> exit code, reaped but not yet handled
        self.reasons: dict[str, Reason] = {}
        self.lane_state: dict[str, tuple[str, str, str, str]] = {}
        self.lane_since: dict[str, float] = {}
        self.announced: dict[tuple[str, str], float] = {}
        self.failures: list[tuple[float, str, str, str]] = []  # (time, job, signature, line)
        self.correlated: dict[str, int] = {}
        self.idle_since: float | None = None
        self.gpu_unknown: list[procs.GpuUser] = []
        self.started_at = 0.0
        self.ticks = 0
        self._manifest_cache: tuple[tuple[int, int, int], dict[str, Any] | None] | None = None
        self._presence_tick = -1
        self._manifest_tick = -1
        self.park = ""
        self._presence_sets: tuple[set[str], set[str]] = (set(), set())
        self._lock_fd: int | None = None
        self.first_seen: dict[str, tuple[tuple[int, int, int], float]] = {}  # settle rule: key, first scan
        self.stuck: dict[str, str] = {}  # invalid entries that could not be moved to failed/
        self.settle_due: float | None = None  # when the next settling file may be taken
        self.lifetimes: list[leaks.Lifetime] = []  # jobs' start..end in clock ticks, to name a leak's job
        self.kept_leaks: dict[int, str] = {}  # --keep-leaks: pid -> the job that left it
        self.write_errors: dict[str, str] = {}  # file -> why the runner cannot keep it now
        self.disk_full: str = ""  # why jobs cannot start, while the disk is full
        self.corrupt_said: dict[str, set[Problem]] = {}  # state-corrupt problems already reported, per file

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, now: float) -> None:
        self.queue.ensure()
        self._lock()
        self.state, problems = self.queue.load_state()
        self.started_at = now
        procs.set_child_subreaper()
        self.queue.emit(now, "-", Event.RUNNER_START.value, pid=os.getpid(), version=__version__,
                        instance=self.instance, last_alive=self._last_alive())
        self._report_corrupt(now, "state.json", problems)
        leftovers = [p for p in procs.all_procs() if p.tag and p.tag.startswith(self.root_id + ":")]
        if leftovers:
            procs.end_processes([p.pid for p in leftovers], self.config.kill_grace_s, self.reap)
            self.queue.emit(now, "-", Event.ORPHANS_KILLED.value, why="left by an earlier runner life",
                            pids=[p.pid for p in leftovers], cmds=[p.cmdline[:200] for p in leftovers])
        if self.config.cgroup:
            for name in sorted(os.listdir(self.config.cgroup)):
                if name.startswith("job-"):
                    killed = procs.cgroup_kill(os.path.join(self.config.cgroup, name), 5.0, self.reap)
                    if killed:
                        self.queue.emit(now, name[4:], Event.ORPHANS_KILLED.value, why="left in its cgroup by an "
                                        "earlier runner life", pids=killed, cgroup=True)
        # Read once the leftovers are gone: a wrapper records an exit only when the job ended by itself (one
        # ended by us records nothing), so a record here is a job that finished while we were down.
        records = {f: r for f in self.queue.jobs("running") if (r := wrapper.read_record(self.queue.exit_record(f)))}
        for filename in self.queue.list_all("running"):
            if filename in records:
                self._finish_recorded(now, filename, records[filename])
            else:
                self._leave_running(filename, "queue")
                self._refund(filename)
                self.queue.emit(now, filename, Event.RECOVERED.value)
        for name in os.listdir(self.queue.dir("running")):
            if name.startswith(".") and name.endswith(".exit") and name[1:-5] not in records:
                wrapper.clear_record(self.queue.dir("running") / name)  # a record whose job is gone
        self._save_state(now)

    def _last_alive(self) -> str | None:
        """The previous life's last heartbeat, from the status.json it left (for downtime in `plan report`)."""
        try:
            beat = read_json(self.queue.status_path)["runner"]["heartbeat"]
            return timestamp(float(beat))
        except (OSError, ValueError, TypeError, KeyError, OverflowError):
            return None

    def _lock(self) -> None:
        """One runner per queue root: a second would end the first one's jobs as leftovers of an earlier life."""
        path = self.queue.root / ".runner.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(f"another runner (pid {holder}) already serves {self.root}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd  # held, never closed, for the life of the process

    def stop(self, now: float, why: str = "SIGTERM") -> None:
        """End every job's tree and put the jobs back in queue/ without using an attempt."""
        for lane, run in list(self.running.items()):
            self._end_tree(run)
            self.running.pop(lane)
            self.exited.pop(run.pid, None)
            record = wrapper.read_record(self.queue.exit_record(run.filename))
            if record:  # it finished by itself just before we ended it: recorded as it ended, not re-run
                self._finish(now, run, record.rc, ended=record.ended)
                continue
            self._leave_running(run.filename, "queue")
            self._refund(run.filename)
            self.queue.emit(now, run.filename, Event.RECOVERED.value, why=f"runner stopped ({why})")
        for lane in self.config.lanes:
            self._set_lane(now, lane, ("stopped", "", "", ""))
        self.queue.emit(now, "-", Event.RUNNER_STOP.value, why=why)
        self._save_state(now)
        try:
            self._write_status(now, [])
        except OSError:
            pass
        self.queue.close()

    def serve(self) -> int:
        """Tick until SIGTERM/SIGINT; a child's exit wakes the loop at once."""
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        stop_signal: list[str] = []

        def on_stop(signum: int, _frame: object) -> None:
            stop_signal.append(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.start(time.time())
        queue_dir = str(self.queue.dir("queue"))
        while not stop_signal:
            # Taken before the tick: a file that lands during the tick is seen at once afterwards
            # (the tick's own moves cost one extra tick, which then finds nothing to do).
            seen = _mtime(queue_dir)
            try:
                self.tick(time.time())
            except OSError as exc:
                # A disk full or a permission changed under us: say so and try again next tick, rather than
                # die and be restarted in a loop. status.json stops being rewritten, so `plan watch` sees DEAD.
                traceback.print_exc()
                print(f"runner: tick failed: {exc}", file=sys.stderr, flush=True)
            wait = self.config.tick_s
            if self.settle_due is not None:  # a file being written is taken the moment it has settled
                wait = min(wait, max(self.settle_due - time.time(), 0.0) + 0.01)
            next_tick = time.monotonic() + wait
            _drain(rfd)
            # Between ticks, wake at once for a child's exit and within DIR_POLL_S for a new job file
            # (one stat of queue/), so neither waits for the next tick.
            while not stop_signal and not self._child_waiting():
                left = next_tick - time.monotonic()
                if left <= 0:
                    break
                if select.select([rfd], [], [], min(left, DIR_POLL_S))[0]:
                    _drain(rfd)
                    continue
                if _mtime(queue_dir) != seen:
                    break
        self.stop(time.time(), stop_signal[0])
        return 0

    # -- the tick ------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.ticks += 1
        self.clock = now
        self.queue.reopen_if_rotated()
        self.reap()
        self._manifest()  # read (and checked) whenever it changes, not only when a reason needs it
        self._controls(now)
        self._finish_exited(now)
        self._enforce_timeouts(now)
        self._watch_running(now)
        queued = self._scan(now)
        self._schedule(now, queued)
        self._announce_waits(now, queued)
        self._update_lanes(now, queued)
        self._check_idle(now, queued)
        self._save_state(now)
        self._keep(now, "status.json", lambda: self._write_status(now, queued))
        if now - self.queue.last_written >= self.config.heartbeat_event_s:
            # Nothing else said we were alive for that long: `plan report` measures downtime from this.
            self.queue.emit(now, "-", Event.HEARTBEAT.value, tick=self.ticks)

    def _save_state(self, now: float) -> None:
        self._keep(now, "state.json", lambda: self.queue.save_state(self.state))

    def _keep(self, now: float, name: str, write: Callable[[], None]) -> None:
        """Write one of the runner's files; one that cannot be written (disk full, permissions) is said once,
        kept in memory, named in status.json and retried every tick, rather than stopping the runner."""
        try:
            write()
        except OSError as exc:
            why = f"cannot write {name}: {exc.strerror or exc}; kept in memory, retried every tick"
            if name not in self.write_errors:
                self.queue.emit(now, "-", Event.STATE_CORRUPT.value, file=name, field="(write)", why=why)
            self.write_errors[name] = why
            return
        self.write_errors.pop(name, None)

    def _report_corrupt(self, now: float, name: str, problems: list[Problem]) -> None:
        """One state-corrupt event per wrong field of NAME, not repeated while that file stays the same."""
        said = self.corrupt_said.setdefault(name, set())
        for field, why in problems:
            if (field, why) not in said:
                said.add((field, why))
                self.queue.emit(now, "-", Event.STATE_CORRUPT.value, file=name, field=field, why=why)
        if not problems:
            said.clear()

    def reap(self) -> None:
        """Collect every child that ended: our jobs' codes are kept, orphans are just reaped."""
        ours = {run.pid for run in self.running.values()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in ours:
                self.exited[pid] = os.waitstatus_to_exitcode(status)

    def _child_waiting(self) -> bool:
        try:
            return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return False

    # -- scanning and parsing ------------------------------------------------------------------
    def _forget(self, filename: str) -> None:
        for table in (self.parsed, self.reasons, self.first_seen, self.stuck):
            table.pop(filename, None)
        self.state["waiting_since"].pop(filename, None)

    def _holds(self, cond: Condition | None) -> tuple[bool, str]:
        if cond is None:
            return True, ""
        outcome = evaluate(cond, self.root, self.config.condition_timeout_s)
        return outcome.holds, outcome.detail

    # -- scheduling ----------------------------------------------------------------------------
    def _schedule(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        parked = self.park
        gpu_users: list[procs.GpuUser] | None = None
        by_lane: dict[str, list[tuple[str, Parsed]]] = {lane: [] for lane in self.config.lanes}
        for item in queued:
            by_lane[item[1].job.lane].append(item)  # type: ignore[union-attr]
        for lane in self.config.lanes:
            started_here = ""
            for filename, parsed in by_lane[lane]:
                job = parsed.job
                assert isinstance(job, jobfile.JobFile)
                done, _ = self._holds(parsed.done_if) if parsed.done_if else (False, "")
                # Rerun on change: done only if its stamp matches; a stale job runs, or waits for its producers.
                fresh = stamps.judge(self.root, filename, job, self._manifest(), now, done)
                self._report_corrupt(now, fresh.file, fresh.problems)
                if fresh.stale:
                    self._reason(now, filename, Why.STALE.value, fresh.why, fresh.blocker)
                    done = False
                    if fresh.wait:
                        continue
                if done:
                    if self.queue.move(filename, "queue", "done"):
                        self.queue.emit(now, filename, "skipped", note="DONE_IF already true")
                    self._forget(filename)
                    continue
                until = self.state["backoff_until"].get(filename, 0)
                if until > now:
                    self._reason(now, filename, "backoff", f"retry at {timestamp(until)}")
                    continue
                ok, why = self._holds(parsed.requires)
                if not ok:
                    self._requires_false(now, filename, job, why)
                    continue
                self.state["waiting_since"].pop(filename, None)
                if started_here:
                    self._reason(now, filename, "order", f"{started_here} is ahead of it", started_here)
                    continue
                if lane in self.running:
                    held = self.running[lane].filename
                    self._reason(now, filename, "lane-busy", f"{held} is running in {lane}", held)
                    continue
                other = self._exclusive_holder(lane)
                if other:
                    self._reason(now, filename, "exclusive", f"{other.filename} holds exclusive lane {other.lane}",
                                 other.filename)
                    continue
                if parked:
                    self._reason(now, filename, "parked", parked)
                    continue
                if lane == self.config.gpu_lane:
                    if gpu_users is None:
                        gpu_users = self._gpu_users()
                    if gpu_users:
                        self._gpu_wait(now, filename, gpu_users)
                        continue
                if self._start(now, filename, job):
                    started_here = filename
        # The gpu-wait repeat is per foreign process; forget those that went away.
        if gpu_users is not None and not gpu_users:
            for key in [k for k in self.announced if k[0] == "gpu-wait"]:
                self.announced.pop(key)

    def _exclusive_holder(self, lane: str) -> Running | None:
        if lane not in self.config.exclusive:
            return None
        for other in self.config.exclusive:
            if other != lane and other in self.running:
                return self.running[other]
        return None

    # -- running jobs --------------------------------------------------------------------------
    def _start(self, now: float, filename: str, job: jobfile.JobFile) -> bool:
        attempt = int(self.state["attempts"].get(filename, 0)) + 1
        try:
            moved = self.queue.move(filename, "queue", "running")
        except OSError as exc:
            return self._start_failed(now, filename, exc, moved=False)
        if not moved:
            return False  # removed between the scan and now (a push retiring it, a person): nothing to start
        record = self.queue.exit_record(filename)
        tag = f"{self.root_id}:{self.instance}:{filename}"
        try:
            wrapper.clear_record(record)  # one left by an earlier attempt would read as this one's end
            fd = os.open(self.queue.log_path(filename), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"=== {timestamp(now)} start {filename} attempt {attempt} ===\n".encode())
                offset = os.fstat(fd).st_size
                env = dict(os.environ)
                env[procs.TAG_VAR] = tag
                env[procs.JOB_VAR] = filename
                cgroup = self._job_cgroup(filename)
                # The wrapper joins the job's cgroup before it runs anything (so nothing escapes it), runs the
                # job and records its exit status next to it, which survives a runner killed meanwhile.
                argv = wrapper.argv(str(self.queue.dir("running") / filename), record,
                                    os.path.join(cgroup, "cgroup.procs") if cgroup else None)
                pid = procs.spawn(argv, env, self.root, fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return self._start_failed(now, filename, exc, moved=True)
        self.state["attempts"][filename] = attempt
        self.running[job.lane] = Running(filename, job, pid, job.lane, attempt, now, offset, tag,
                                         log_size=offset, log_grew_at=now, cgroup=cgroup)
        self.lifetimes.append(leaks.Lifetime(filename, leaks.start_ticks(pid) or leaks.now_ticks()))
        del self.lifetimes[:-leaks.LIFETIMES_KEPT]
        self.reasons.pop(filename, None)
        self.state["backoff_until"].pop(filename, None)
        self.announced.pop(("start-failed", filename), None)
        self.disk_full = ""
        self.queue.emit(now, filename, Event.START.value, lane=job.lane, pid=pid, attempt=attempt)
        return True

    def _start_failed(self, now: float, filename: str, exc: OSError, moved: bool) -> bool:
        """The job could not be started (ENOSPC writing its log, no fork): back to queue/, no attempt used, said
        once per spell; a full disk shows as `disk-full` in status.json while it lasts, and the queue drains by
        itself once space returns."""
        if moved:
            try:
                self._leave_running(filename, "queue")
            except OSError:
                pass  # left in running/: the next runner start puts it back
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        why = f"{code}: {exc.strerror or exc}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.disk_full = f"{filename} could not start: {why}"
            self._reason(now, filename, Why.DISK_FULL.value, why)
        else:
            self._reason(now, filename, Why.BACKOFF.value, f"could not start ({why}); tried again next tick")
        if self._due_global(("start-failed", filename), now, self.config.gpu_wait_repeat_s):
            self.queue.emit(now, filename, Event.START_FAILED.value, errno=code, error=str(exc.strerror or exc))
        return False

    def _job_cgroup(self, filename: str) -> str | None:
        base = self.config.cgroup
        if not base:
            return None
        path = os.path.join(base, f"job-{filename}")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
        return path

    def _tree(self, run: Running) -> list[procs.Proc]:
        """Every live process of RUN: in its cgroup, carrying its tag, or still in its session."""
        in_cgroup = set(procs.cgroup_pids(run.cgroup)) if run.cgroup else set()
        return [p for p in procs.all_procs()
                if p.state not in ("Z", "X") and p.pid != os.getpid()
                and (p.tag == run.tag or p.sid == run.pid or p.pid in in_cgroup)]

    def _end_tree(self, run: Running) -> list[procs.Proc]:
        tree = self._tree(run)
        if tree:
            procs.end_processes([p.pid for p in tree], self.config.kill_grace_s, self.reap)
        if run.cgroup:
            procs.cgroup_kill(run.cgroup, 5.0, self.reap)
        self.reap()
        return tree

    def _enforce_timeouts(self, now: float) -> None:
        for run in list(self.running.values()):
            limit = run.job.timeout_s
            if limit is None or run.timed_out or now - run.started < limit or run.pid in self.exited:
                continue
            run.timed_out = True
            tree = self._end_tree(run)
            self.queue.emit(now, run.filename, "timeout", limit_s=limit, elapsed_s=int(now - run.started),
                            pids=[p.pid for p in tree], attempt=run.attempt)
        self._finish_exited(now)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _refund(self, filename: str) -> None:
        attempts = self.state["attempts"]
        if attempts.get(filename, 0) > 0:
            attempts[filename] -= 1


DIR_POLL_S = 0.5


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass
