"""Waiting that lasts becomes an event, repeated while it lasts; lanes' states; status.json every tick."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runner import FORMAT_VERSION, __version__, jobfile, logs, procs
from runner.base import RunnerBase
from runner.progress import parse_progress
from runner.queue import timestamp, write_json
from runner.records import Parsed


class Announcements(RunnerBase):
    """Mixed into Runner: requires-wait, blocked, idle, long-running, stalled, correlated-failure, lane, status."""

    def _correlate(self, now: float, filename: str, lines: list[str]) -> None:
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
            self.queue.emit(now, "-", "correlated-failure", jobs=jobs, line=line[:300], signature=sig,
                            message=f"{len(jobs)} jobs failed with: {line[:200]}")

    def _watch_running(self, now: float) -> None:
        cfg = self.config
        for run in self.running.values():
            path = self.queue.log_path(run.filename)
            try:
                size = path.stat().st_size
            except OSError:
                size = run.log_size
            if size != run.log_size:
                run.log_size, run.log_grew_at = size, now
                run.announced.pop("stalled", None)
            warn = run.job.warn_after_s or cfg.warn_after.get(run.lane)
            elapsed = now - run.started
            if warn and elapsed >= warn and self._due(run.announced, "long-running", now, cfg.long_running_repeat_s):
                self.queue.emit(now, run.filename, "long-running", lane=run.lane, elapsed_s=int(elapsed),
                                warn_after_s=warn, last_line=logs.last_line(path), progress=self._progress(path))
            silent = now - run.log_grew_at
            if silent >= cfg.stall_s and self._due(run.announced, "stalled", now, cfg.stall_repeat_s):
                self.queue.emit(now, run.filename, "stalled", lane=run.lane, silent_s=int(silent),
                                log_size=size, last_line=logs.last_line(path), progress=self._progress(path))

    @staticmethod
    def _progress(path: Path) -> str | None:
        return parse_progress("\n".join(logs.tail_lines(path, 20)))

    @staticmethod
    def _due(announced: dict[str, float], key: str, now: float, repeat: float) -> bool:
        last = announced.get(key)
        if last is not None and now - last < repeat:
            return False
        announced[key] = now
        return True

    # -- waiting announcements -----------------------------------------------------------------
    def _announce_waits(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        cfg = self.config
        for filename, reason in self.reasons.items():
            if reason.reason == "requires":
                waited = now - reason.since
                key = ("requires-wait", filename)
                if waited >= cfg.requires_warn_s and self._due_global(key, now, cfg.requires_repeat_s):
                    self.queue.emit(now, filename, "requires-wait", requires=reason.detail, waited_s=int(waited))
            elif reason.reason == "blocked":
                key = ("blocked", filename + "|" + reason.detail)
                if self._due_global(key, now, cfg.blocked_repeat_s):
                    self.queue.emit(now, filename, "blocked", path=reason.extra.get("path"),
                                    producer=reason.extra.get("producer") or None, why=reason.detail,
                                    waited_s=int(now - reason.since))

    def _due_global(self, key: tuple[str, str], now: float, repeat: float) -> bool:
        last = self.announced.get(key)
        if last is not None and now - last < repeat:
            return False
        self.announced[key] = now
        return True

    def _lane_view(self, lane: str, queued: list[tuple[str, Parsed]]) -> tuple[str, str, str, str]:
        if lane in self.running:
            return ("busy", self.running[lane].filename, "", "")
        waiting = [(f, self.reasons.get(f)) for f, p in queued
                   if isinstance(p.job, jobfile.JobFile) and p.job.lane == lane and f in self.reasons]
        if not waiting:
            return ("idle", "", "", "")
        # The job that would run but for something outside it names the lane's cause.
        for f, reason in waiting:
            if reason and reason.reason not in ("requires", "blocked", "order", "lane-busy"):
                return ("waiting", f, reason.reason, reason.blocker)
        f, reason = waiting[0]
        assert reason is not None
        return ("waiting", f, reason.reason, reason.blocker)

    def _update_lanes(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        for lane in self.config.lanes:
            view = self._lane_view(lane, queued)
            self._set_lane(now, lane, view)
            if view[0] == "waiting" and now - self.lane_since[lane] >= self.config.idle_s:
                if self._due_global(("idle-lane", lane), now, self.config.idle_repeat_s):
                    self.queue.emit(now, "-", "idle", lane=lane, idle_s=int(now - self.lane_since[lane]),
                                    waiting=view[1], reason=view[2], blocker=view[3])
            elif view[0] != "waiting":
                self.announced.pop(("idle-lane", lane), None)

    def _set_lane(self, now: float, lane: str, view: tuple[str, str, str, str]) -> None:
        if self.lane_state.get(lane) == view:
            return
        self.lane_state[lane] = view
        self.lane_since[lane] = now
        state, job, reason, blocker = view
        details: dict[str, Any] = {"lane": lane, "state": state}
        if reason:
            details["reason"] = reason
        if blocker:
            details["blocker"] = blocker
        self.queue.emit(now, job or "-", "lane", **details)

    def _check_idle(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        if self.running or not queued:
            self.idle_since = None
            self.announced.pop(("idle", "-"), None)
            return
        if self.idle_since is None:
            self.idle_since = now
        idle = now - self.idle_since
        if idle >= self.config.idle_s and self._due_global(("idle", "-"), now, self.config.idle_repeat_s):
            waiting = {f: f"{r.reason}: {r.detail}" for f, r in self.reasons.items()}
            self.queue.emit(now, "-", "idle", idle_s=int(idle), queued=len(queued), waiting=waiting)

    def _write_status(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        running = []
        for run in self.running.values():
            path = self.queue.log_path(run.filename)
            running.append({
                "job": run.filename, "lane": run.lane, "pid": run.pid, "attempt": run.attempt,
                "started": run.started, "elapsed_s": round(now - run.started, 1), "log": str(path),
                "log_size": run.log_size, "log_grew_at": run.log_grew_at,
                "timeout_s": run.job.timeout_s,
                "warn_after_s": run.job.warn_after_s or self.config.warn_after.get(run.lane),
                "last_line": logs.last_line(path),
                "progress": self._progress(path),
            })
        waiting = []
        lanes = {filename: parsed.job.lane for filename, parsed in queued}  # type: ignore[union-attr]
        # Queued jobs with a reason, then files not yet jobs: settling, or invalid and stuck in queue/.
        for filename in [f for f, _ in queued] + sorted(f for f in self.reasons if f not in lanes):
            reason = self.reasons.get(filename)
            if reason is None:
                continue
            waiting.append({"job": filename, "lane": lanes.get(filename),
                            "reason": reason.reason, "detail": reason.detail, "blocker": reason.blocker,
                            "since": reason.since})
        status = {
            "runner": {"pid": os.getpid(), "version": __version__, "format_version": FORMAT_VERSION,
                       "instance": self.instance, "root": self.root, "started": self.started_at,
                       "heartbeat": now, "heartbeat_ts": timestamp(now), "tick": self.ticks,
                       "tick_s": self.config.tick_s},
            "lane_order": list(self.config.lanes),
            "lanes": {lane: {"state": v[0], "job": v[1], "reason": v[2], "blocker": v[3],
                             "since": self.lane_since.get(lane)} for lane, v in self.lane_state.items()},
            "running": running,
            "queued": waiting,
            "parked": self.park or None,
            "gpu_unknown": {"count": len(self.gpu_unknown), "policy": self.config.unreadable_gpu,
                            "processes": [{"pid": u.pid, "cmd": u.cmd[:120]} for u in self.gpu_unknown[:20]]},
            "counts": {s: len(self.queue.jobs(s)) for s in ("queue", "running", "done", "failed")},
            "disk_full": self.disk_full or None,
            "write_errors": {**self.write_errors,
                             **({"events.jsonl": self.queue.events_error} if self.queue.events_error else {})},
            "leaks": [{"pid": pid, "left_by": job} for pid, job in sorted(self.kept_leaks.items())
                      if procs.alive(pid)],
        }
        write_json(self.queue.status_path, status)
