"""Requests from `plan` (retry, cancel, park --now, push --retry-failed) that the runner carries out between ticks."""
from __future__ import annotations

import json
import os

from runner.base import RunnerBase
from runner.queue import timestamp

# A control request is the file control/<action>-<target>, JSON {"by": ...} inside. The actions are a
# closed set with no '-' of their own, so the first '-' ends the action even when the job name has more.
CONTROL_ACTIONS = ("reset", "retry", "cancel", "requeue")
REQUEUE_RUNNING = "running"  # the target of `requeue`: every running job (park --now)
PARK_FILE = "parked.json"


def request_name(action: str, target: str) -> str:
    """The control/ file name of ACTION on TARGET (a job file name, or `running` for requeue)."""
    if action not in CONTROL_ACTIONS:
        raise ValueError(f"unknown control action {action!r}")
    if not target or "/" in target or target.startswith("."):
        raise ValueError(f"bad control target {target!r}")
    return f"{action}-{target}"


def parse_request_name(name: str) -> tuple[str, str] | None:
    """(action, target) of a control/ file name; None for anything that is not a request."""
    action, sep, target = name.partition("-")
    if not sep or action not in CONTROL_ACTIONS or not target or name.startswith("."):
        return None
    return action, target


def park_record(reason: str, by: str, since: str) -> dict[str, str]:
    """The parked.json object `plan park` writes and `_parked` reads."""
    return {"since": since, "reason": reason, "by": by}


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
            parsed = parse_request_name(name)
            action, job = parsed if parsed else ("", "")
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
        park = self.queue.root / PARK_FILE
        if not park.exists():
            return ""
        try:
            info = json.loads(park.read_text())
            return f"parked since {info.get('since', '?')}: {info.get('reason', '')}".strip()
        except (OSError, ValueError):
            return "parked"
