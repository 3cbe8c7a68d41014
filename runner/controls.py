"""Requests from `plan` (retry, cancel, park --now, push --retry-failed) that the runner carries out between ticks."""
from __future__ import annotations

import json
import os

from runner.base import RunnerBase
from runner.queue import timestamp


class Controls(RunnerBase):
    """Mixed into Runner: control/ requests and the park file."""

    def _controls(self, now: float) -> None:
        """Requests dropped in control/ by `plan` (retry, cancel, park --now, push --retry-failed), applied here
        so that they follow the runner's own rules while it ticks."""
        control = self.queue.root / "control"
        try:
            names = sorted(n for n in os.listdir(control) if not n.startswith(".") and "-" in n)
        except FileNotFoundError:
            names = []
        for name in names:
            action, _, job = name.partition("-")  # <action>-<job file name>, JSON inside
            try:
                request = json.loads((control / name).read_text() or "{}")
            except (OSError, ValueError):
                request = {}
            by = str(request.get("by", "?"))
            if action == "reset":
                self._reset(job)
            elif action == "retry":
                self._retry(now, job, by)
            elif action == "cancel":
                self._cancel(now, job, by)
            elif action == "requeue" and job == "running":
                self._requeue_running(now, by)
            try:
                os.unlink(control / name)
            except OSError:
                pass
        parked, was_parked = self._parked(), bool(self.park)
        self.park = parked  # read once a tick; scheduling and status.json use it
        if bool(parked) != was_parked:
            if parked:
                self.queue.emit(now, "-", "parked", why=parked)
            else:
                self.queue.emit(now, "-", "unparked")

    def _reset(self, job: str) -> None:
        for key in ("attempts", "backoff_until", "last_failure", "waiting_since"):
            self.state[key].pop(job, None)

    def _retry(self, now: float, job: str, by: str) -> None:
        if not (self.queue.dir("failed") / job).exists():
            self.queue.emit(now, job, "retry", by=by, note="not in failed/: nothing to retry")
            return
        self._reset(job)
        self.queue.move(job, "failed", "queue")
        self.queue.emit(now, job, "retry", by=by, note="re-queued from failed/, attempts reset")

    def _cancel(self, now: float, job: str, by: str) -> None:
        for lane, run in list(self.running.items()):
            if run.filename == job:
                tree = self._end_tree(run)
                self.running.pop(lane)
                self.exited.pop(run.pid, None)
                self.queue.move(job, "running", "failed")
                self.state["last_failure"][job] = {"ts": timestamp(now), "rc": None, "summary": f"cancelled by {by}"}
                self.queue.emit(now, job, "cancelled", by=by, was="running", pids=[p.pid for p in tree])
                return
        if (self.queue.dir("queue") / job).exists():
            os.unlink(self.queue.dir("queue") / job)
            self._forget(job)
            self.queue.emit(now, job, "cancelled", by=by, was="queued")
            return
        self.queue.emit(now, job, "cancelled", by=by, was="neither queued nor running: nothing done")

    def _requeue_running(self, now: float, by: str) -> None:
        for lane, run in list(self.running.items()):
            self._end_tree(run)
            self.running.pop(lane)
            self.exited.pop(run.pid, None)
            self.queue.move(run.filename, "running", "queue")
            self._refund(run.filename)
            self.queue.emit(now, run.filename, "recovered", why=f"parked --now by {by}")

    def _parked(self) -> str:
        park = self.queue.root / "parked.json"
        if not park.exists():
            return ""
        try:
            info = json.loads(park.read_text())
            return f"parked since {info.get('since', '?')}: {info.get('reason', '')}".strip()
        except (OSError, ValueError):
            return "parked"
