"""Requests from `plan` (retry, cancel, park --now, push --retry-failed) that the runner carries out between ticks."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from runner import jobfile
from runner.base import RunnerBase
from runner.queue import read_regular, timestamp
from runner.state import Problem, check_park, check_request
from runner.vocab import Event

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
        so that they follow the runner's own rules while it ticks. A bad one is removed first and reported once
        (`state-corrupt`); a good one is removed once carried out, even if that failed: none is tried every tick."""
        control = self.queue.root / "control"
        try:
            names = sorted(n for n in os.listdir(control) if not n.startswith("."))
        except FileNotFoundError:
            names = []
        for name in names:
            parsed = parse_request_name(name)  # <action>-<target>, JSON inside
            action, job = parsed if parsed else (name.partition("-")[0], name.partition("-")[2])
            path = control / name
            if not os.path.lexists(path):
                continue  # gone already
            text = read_regular(str(path))  # never blocks on a FIFO
            request, problems = self._request(name, action, job, text)
            if request is None:  # removed first, then reported: a bad request is said once, never retried
                _remove(path)
                self._report_corrupt(now, f"control/{name}", problems)
                self.corrupt_said.pop(f"control/{name}", None)  # a new request of that name is a new report
                continue
            try:
                self._carry_out(now, action, job, request["by"])
            finally:
                _remove(path)  # after the action, so `plan` reads "taken" as "done", and even if it failed

        parked, was_parked = self._parked(now), bool(self.park)
        self.park = parked  # read once a tick; scheduling and status.json use it
        if bool(parked) != was_parked:
            if parked:
                self.queue.emit(now, "-", Event.PARKED.value, why=parked)
            else:
                self.queue.emit(now, "-", Event.UNPARKED.value)

    def _carry_out(self, now: float, action: str, job: str, by: str) -> None:
        if action == "reset":
            self._reset(job)
        elif action == "retry":
            self._retry(now, job, by)
        elif action == "cancel":
            self._cancel(now, job, by)
        else:
            self._requeue_running(now, by)

    @staticmethod
    def _request(name: str, action: str, job: str, text: bytes | None) -> tuple[dict[str, str] | None, list[Problem]]:
        if action == "requeue":
            if job != "running":
                return None, [("(name)", f"unknown request {name!r}: requeue-running is the only requeue")]
        elif action not in ("reset", "retry", "cancel"):
            return None, [("(name)", f"unknown request {name!r}: want reset-, retry- or cancel-JOB or requeue-running")]
        elif not (job.endswith(".job") and jobfile.NAME_RE.match(jobfile.job_name(job)) and ".." not in job):
            return None, [("(name)", f"request {name!r} does not name a job file: not carried out")]
        if text is None:
            return None, [("(whole file)", "not a regular file: request not carried out")]
        try:
            raw = json.loads(text) if text.strip() else None
        except ValueError as exc:
            return None, [("(whole file)", f"not JSON ({exc}): request not carried out")]
        return check_request(raw)

    def _reset(self, job: str) -> None:
        for key in ("attempts", "backoff_until", "last_failure", "waiting_since"):
            self.state[key].pop(job, None)

    def _retry(self, now: float, job: str, by: str) -> None:
        if not (self.queue.dir("failed") / job).exists():
            return  # refused: nothing happened, so no event (`plan retry` tells its caller where the job is)
        self._reset(job)
        self.queue.move(job, "failed", "queue")
        self.queue.emit(now, job, "retry", by=by, note="re-queued from failed/, attempts reset")

    def _cancel(self, now: float, job: str, by: str) -> None:
        for lane, run in list(self.running.items()):
            if run.filename == job:
                tree = self._end_tree(run)
                self.running.pop(lane)
                self.exited.pop(run.pid, None)
                self._leave_running(job, "failed")
                self.state["last_failure"][job] = {"ts": timestamp(now), "rc": None, "summary": f"cancelled by {by}"}
                self.queue.emit(now, job, "cancelled", by=by, was="running", pids=[p.pid for p in tree])
                return
        try:
            os.unlink(self.queue.dir("queue") / job)
        except OSError:
            return  # refused (neither queued nor running): nothing happened, so no event
        self._forget(job)
        self.queue.emit(now, job, "cancelled", by=by, was="queued")

    def _requeue_running(self, now: float, by: str) -> None:
        for lane, run in list(self.running.items()):
            self._end_tree(run)
            self.running.pop(lane)
            self.exited.pop(run.pid, None)
            self._leave_running(run.filename, "queue")
            self._refund(run.filename)
            self.queue.emit(now, run.filename, "recovered", why=f"parked --now by {by}")

    def _parked(self, now: float) -> str:
        park = self.queue.root / PARK_FILE
        if not os.path.lexists(park):
            self._report_corrupt(now, PARK_FILE, [])
            return ""
        text = read_regular(str(park))
        if text is None:
            return "parked (parked.json unreadable)"
        try:
            reason, problems = check_park(json.loads(text))
        except ValueError as exc:
            reason, problems = "parked", [("(whole file)", f"not JSON ({exc}): parked without a reason")]
        self._report_corrupt(now, "parked.json", problems)
        return reason


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass
