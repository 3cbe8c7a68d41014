"""Waiting that lasts becomes an event, repeated while it lasts (one Throttle for every repeat); lanes' states."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from runner import jobfile, logs, procs
from runner.config import Config
from runner.progress import parse_progress
from runner.queue import Queue
from runner.records import Parsed, Running
from runner.service.reasons import Reasons
from runner.throttle import Throttle
from runner.vocab import Event, Reason

if TYPE_CHECKING:
    from runner.service.gpu import GpuWatch

_LANE_OWN_WAITS = ("requires", "blocked", "order", "lane-busy")  # reasons of a job, not of its lane
HELD = Reason.HELD.value  # a held job is no work waiting: its lane is idle, not waiting


class LaneView(NamedTuple):
    state: str  # busy, idle, waiting, stopped
    job: str = ""
    reason: str = ""
    blocker: str = ""
    busy: int = 0  # slots in use, in a lane of more than one slot (a change of it is a lane event)


def progress(path: Path) -> str | None:
    return parse_progress("\n".join(logs.tail_lines(path, 20)))


class Announcer:
    """requires-wait, blocked, gpu-wait, start-failed, idle, long-running, stalled, correlated-failure, lane."""

    def __init__(self, config: Config, queue: Queue, reasons: Reasons) -> None:
        self.config = config
        self.queue = queue
        self.reasons = reasons
        self.throttle = Throttle()
        self.lane_state: dict[str, LaneView] = {}
        self.lane_since: dict[str, float] = {}
        self.idle_since: float | None = None
        self.failures: list[tuple[float, str, str, str]] = []  # (time, job, signature, line)
        self.correlated: dict[str, int] = {}
        self._views: tuple[tuple[Any, ...], dict[str, LaneView]] | None = None  # (computed from, the views)
        self._runs: dict[str, tuple[str, ...]] = {}  # lane -> its running jobs when its view was computed
        self._complete = True  # every view in _views was computed from the reasons as they were then
        # The runner's look at the GPUs (its jobs' engine time), once wired; None until a first look made it.
        self.watch: Callable[[], GpuWatch | None] = lambda: None

    def correlate(self, now: float, filename: str, lines: list[str]) -> None:
        if not lines:
            return
        line = lines[-1]
        sig = logs.signature(line, filename)
        window = self.config.correlate_window_s
        self.failures = [f for f in self.failures if now - f[0] <= window]
        self.failures.append((now, filename, sig, line))
        jobs = sorted({f[1] for f in self.failures if f[2] == sig})
        if len(jobs) >= self.config.correlate_min and len(jobs) > self.correlated.get(sig, 0):
            self.correlated[sig] = len(jobs)
            self.queue.emit(
                now,
                "-",
                "correlated-failure",
                jobs=jobs,
                line=line[:300],
                signature=sig,
                message=f"{len(jobs)} jobs failed with: {line[:200]}",
            )

    def watch_running(self, now: float, running: dict[str, Running]) -> None:
        cfg = self.config
        for run in running.values():
            path = self.queue.log_path(run.filename)
            try:
                size = path.stat().st_size
            except OSError:
                size = run.log_size
            if size != run.log_size:
                run.log_size, run.log_grew_at = size, now
                run.announced.forget("stalled")
            warn = run.job.warn_after_s or cfg.warn_after.get(run.lane)
            elapsed = now - run.started
            if warn and elapsed >= warn and run.announced.due("long-running", now, cfg.long_running_repeat_s):
                self.queue.emit(
                    now,
                    run.filename,
                    "long-running",
                    lane=run.lane,
                    elapsed_s=int(elapsed),
                    warn_after_s=warn,
                    last_line=logs.last_line(path),
                    progress=progress(path),
                )
            silent = now - run.log_grew_at
            if silent >= cfg.stall_s and run.announced.due("stalled", now, cfg.stall_repeat_s):
                self.queue.emit(
                    now,
                    run.filename,
                    "stalled",
                    lane=run.lane,
                    silent_s=int(silent),
                    log_size=size,
                    last_line=logs.last_line(path),
                    progress=progress(path),
                )

    def waits(self, now: float) -> None:
        cfg = self.config
        for filename, reason in self.reasons.items():
            if reason.reason == "requires":
                waited = now - reason.since
                if waited >= cfg.requires_warn_s and self.throttle.due(
                    ("requires-wait", filename), now, cfg.requires_repeat_s
                ):
                    self.queue.emit(now, filename, "requires-wait", requires=reason.detail, waited_s=int(waited))
            elif reason.reason == "blocked":
                if self.throttle.due(("blocked", filename + "|" + reason.detail), now, cfg.blocked_repeat_s):
                    self.queue.emit(
                        now,
                        filename,
                        "blocked",
                        path=reason.extra.get("path"),
                        producer=reason.extra.get("producer") or None,
                        why=reason.detail,
                        waited_s=int(now - reason.since),
                    )

    def gpu_wait(
        self, now: float, filename: str, users: list[procs.GpuUser], left_by: str | None, gpu: int | None = None
    ) -> None:
        first = users[0]
        if self.throttle.due(("gpu-wait", f"{filename}:{first.pid}"), now, self.config.gpu_wait_repeat_s):
            self.queue.emit(
                now,
                filename,
                "gpu-wait",
                pid=first.pid,
                ppid=str(first.ppid),
                cmd=first.cmd[:200],
                why=first.why,
                waited_s=int(now - self.reasons[filename].since),
                others=len(users) - 1,
                **({"left_by": left_by} if left_by else {}),
                **({"gpu": gpu} if gpu is not None else {}),
            )

    def gpu_stalls(self, now: float, running: dict[str, Running]) -> None:
        """A running gpu job whose GPU engine time has not moved for --gpu-stall while its process lives:
        `gpu-stalled`, repeated every --stall-repeat while it lasts (a wedged server can ignore SIGTERM and hold
        the GPU for ever, its log as quiet as a long computation's)."""
        limit, watch = self.config.gpu_stall_s, self.watch()
        for run in running.values():
            mine = watch.jobs.get(run.filename) if watch else None
            if mine is None or run.lane != self.config.gpu_lane:
                continue
            still = now - mine.moved_at
            run.gpu_active_s, run.gpu_watched_s, run.gpu_still_s = mine.active_s, mine.watched_s, still
            if limit <= 0 or still < limit:
                run.announced.forget("gpu-stalled")
                continue
            if run.announced.due("gpu-stalled", now, self.config.stall_repeat_s):
                self.queue.emit(
                    now,
                    run.filename,
                    Event.GPU_STALLED.value,
                    lane=run.lane,
                    gpus=list(mine.devices),
                    still_s=int(still),
                    gpu_stall_s=limit,
                    pid=run.pid,
                    memory=mine.memory,
                    last_line=logs.last_line(self.queue.log_path(run.filename)),
                )

    def forget_gpu_waits(self) -> None:
        """The gpu-wait repeat is per foreign process: once none is left, the next one is said at once."""
        self.throttle.forget_where(lambda key: isinstance(key, tuple) and key[0] == "gpu-wait")

    def start_failed(self, now: float, filename: str, code: str, error: str) -> None:
        if self.throttle.due(("start-failed", filename), now, self.config.gpu_wait_repeat_s):
            self.queue.emit(now, filename, Event.START_FAILED.value, errno=code, error=error)

    def started(self, filename: str) -> None:
        self.throttle.forget(("start-failed", filename))

    def lanes(
        self,
        now: float,
        running: dict[str, Running],
        queued: list[tuple[str, Parsed]],
        generation: int,
        every: bool = True,
        in_lanes: Mapping[str, int] | None = None,
    ) -> None:
        """Each lane's state, and `idle` repeated while a lane waits. An idle lane's view reads its queued jobs'
        reasons: computed again when a reason, the queue (GENERATION: the scan's, which changes with QUEUED, a list
        kept in place) or what runs changed; where not EVERY (a tick between sweeps), only for the lanes whose
        running jobs changed (the others' waiting jobs kept their reasons). IN_LANES: how many of QUEUED each lane
        has (the scanner keeps it): a lane with none is idle without reading the 100,000 of the others."""
        key = (generation, len(queued), self.reasons.generation, tuple((r.filename, r.lane) for r in running.values()))
        # views kept from before are reused unless they were left partly stale by a tick between sweeps
        kept = self._views is not None and (self._complete or not every)
        if kept and self._views[0] == key:  # type: ignore[index]
            views = self._views[1]  # type: ignore[index]
        else:
            old = self._views[1] if self._views is not None and not every else {}
            runs, runs_of = self._runs, self.config.lanes
            self._runs = {lane: tuple(r.filename for r in running.values() if r.lane == lane) for lane in runs_of}
            views = {
                lane: old[lane]
                if lane in old and runs.get(lane) == self._runs[lane]
                else self._lane_view(lane, running, queued, in_lanes)
                for lane in self.config.lanes
            }
            self._views, self._complete = (key, views), not old
        for lane in self.config.lanes:
            view = views[lane]
            self.set_lane(now, lane, view)
            if view.state == "waiting" and now - self.lane_since[lane] >= self.config.idle_s:
                if self.throttle.due(("idle-lane", lane), now, self.config.idle_repeat_s):
                    self.queue.emit(
                        now,
                        "-",
                        "idle",
                        lane=lane,
                        idle_s=int(now - self.lane_since[lane]),
                        waiting=view.job,
                        reason=view.reason,
                        blocker=view.blocker,
                    )
            elif view.state != "waiting":
                self.throttle.forget(("idle-lane", lane))

    def _held(self, filename: str) -> bool:
        reason = self.reasons.get(filename)
        return reason is not None and reason.reason == HELD

    def _lane_view(
        self,
        lane: str,
        running: dict[str, Running],
        queued: list[tuple[str, Parsed]],
        in_lanes: Mapping[str, int] | None = None,
    ) -> LaneView:
        runs = [run.filename for run in running.values() if run.lane == lane]
        if runs:
            return LaneView("busy", runs[0], busy=len(runs) if self.config.slots_of(lane) > 1 else 0)
        if in_lanes is not None and not in_lanes.get(lane):
            return LaneView("idle")
        first: tuple[str, Any] | None = None
        for f, p in queued:
            if not isinstance(p.job, jobfile.JobFile) or p.job.lane != lane:
                continue
            r = self.reasons.get(f)
            if r is None or r.reason == HELD:
                continue
            if r.reason not in _LANE_OWN_WAITS:  # the job that would run but for something outside it: the cause
                return LaneView("waiting", f, r.reason, r.blocker)
            if first is None:
                first = (f, r)
        if first is None:
            return LaneView("idle")
        return LaneView("waiting", first[0], first[1].reason, first[1].blocker)

    def set_lane(self, now: float, lane: str, view: LaneView) -> None:
        if self.lane_state.get(lane) == view:
            return
        self.lane_state[lane] = view
        self.lane_since[lane] = now
        details: dict[str, Any] = {"lane": lane, "state": view.state}
        if view.reason:
            details["reason"] = view.reason
        if view.blocker:
            details["blocker"] = view.blocker
        if view.busy:
            details.update(busy=view.busy, slots=self.config.slots_of(lane))
        self.queue.emit(now, view.job or "-", "lane", **details)

    def idle(self, now: float, running: dict[str, Running], queued: list[tuple[str, Parsed]]) -> None:
        if running or not queued or all(self._held(f) for f, _ in queued):  # held jobs are no work waiting
            self.idle_since = None
            self.throttle.forget(("idle", "-"))
            return
        if self.idle_since is None:
            self.idle_since = now
        idle = now - self.idle_since
        if idle >= self.config.idle_s and self.throttle.due(("idle", "-"), now, self.config.idle_repeat_s):
            waiting = {f: f"{r.reason}: {r.detail}" for f, r in self.reasons.items()}
            self.queue.emit(now, "-", "idle", idle_s=int(idle), queued=len(queued), waiting=waiting)
