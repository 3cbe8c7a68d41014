"""Requests from `plan` (retry, cancel, park --now, push --retry-failed) that the runner carries out between ticks."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from runner import jobfile
from runner.files import read_regular
from runner.queue import Queue, timestamp
from runner.runstate import RunnerState
from runner.service.problems import FileProblems
from runner.state import Problem, check_park, check_request
from runner.vocab import Event

if TYPE_CHECKING:  # runner.jobs imports nothing of this module; the import is for the annotation only
    from runner.service.jobs import Jobs

# A control request is the file control/<action>-<target>, JSON {"by": ...} inside. The actions are a
# closed set with no '-' of their own, so the first '-' ends the action even when the job name has more.
CONTROL_ACTIONS = ("reset", "retry", "cancel", "requeue", "ack")
REQUEUE_RUNNING = "running"  # the target of `requeue`: every running job (park --now)
# `ack-<token>` (`plan ack`): JSON {"by": ..., "target": "KIND[:PATTERN]", "until": EPOCH or null}; the token
# only makes the file name unique, the target is read from inside.
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


class ControlHandler:
    """Carries out control/ requests between ticks, and reads the park file once a tick (`park`)."""

    def __init__(
        self, queue: Queue, state: RunnerState, problems: FileProblems, jobs: Jobs, forget: Callable[[str], None]
    ) -> None:
        self.queue = queue
        self.state = state
        self.problems = problems
        self.jobs = jobs
        self.forget = forget  # drops everything the runner knows about a queued job file
        self.park = ""  # why the queue is parked, read once a tick; '' when it is not
        # The incident book's ack (runner.alerts.engine.Alerts.ack): (now, target, until, by).
        self.on_ack: Callable[[float, str, float | None, str], object] | None = None

    def tick(self, now: float) -> None:
        """Requests dropped in control/ by `plan` (retry, cancel, park --now, push --retry-failed), applied here
        so that they follow the runner's own rules while it ticks. A bad one is removed first and reported once
        (`state-corrupt`); a good one is removed once carried out, even if that failed: none is tried every tick."""
        control = self.queue.root / "control"
        try:
            names = sorted(n for n in os.listdir(control) if not n.startswith("."))
        except FileNotFoundError:
            names = []
        for name in names:
            self._one(now, control / name)
        parked, was_parked = self._parked(now), bool(self.park)
        self.park = parked  # read once a tick; scheduling and status.json use it
        if bool(parked) != was_parked:
            if parked:
                self.queue.emit(now, "-", Event.PARKED.value, why=parked)
            else:
                self.queue.emit(now, "-", Event.UNPARKED.value)

    def _one(self, now: float, path: Path) -> None:
        name = path.name
        parsed = parse_request_name(name)  # <action>-<target>, JSON inside
        action, job = parsed if parsed else (name.partition("-")[0], name.partition("-")[2])
        if not os.path.lexists(path):
            return  # gone already
        text = read_regular(str(path))  # never blocks on a FIFO
        if action == "ack":
            self._ack(now, path, text)
            return
        request, problems = _request(name, action, job, text)
        if request is None:  # removed first, then reported: a bad request is said once, never retried
            _remove(path)
            self.problems.report(now, f"control/{name}", problems)
            self.problems.said.pop(f"control/{name}", None)  # a new request of that name is a new report
            return
        try:
            self._carry_out(now, action, job, request["by"])
        finally:
            _remove(path)  # after the action, so `plan` reads "taken" as "done", and even if it failed

    def _carry_out(self, now: float, action: str, job: str, by: str) -> None:
        if action == "reset":
            self.state.reset(job)
        elif action == "retry":
            self._retry(now, job, by)
        elif action == "cancel":
            self._cancel(now, job, by)
        else:
            for run in list(self.jobs.running.values()):
                self.jobs.evict(now, run, "queue", f"parked --now by {by}", refund=True)

    def _ack(self, now: float, path: Path, text: bytes | None) -> None:
        """An ack: carried out by the incident book, then removed (so `plan ack` reads "taken" as "done"); one
        that names nothing open now is dropped (`plan ack` checked the book before it asked)."""
        problems: list[Problem] = []
        try:
            raw = json.loads(text or b"null")
        except ValueError as exc:
            raw, problems = None, [("(whole file)", f"not JSON ({exc}): ack not carried out")]
        target = raw.get("target") if isinstance(raw, dict) else None
        until = raw.get("until") if isinstance(raw, dict) else None
        by = raw.get("by", "?") if isinstance(raw, dict) else "?"
        if not problems and (
            not isinstance(target, str)
            or not isinstance(by, str)
            or not (until is None or (isinstance(until, (int, float)) and not isinstance(until, bool)))
        ):
            problems = [("(whole file)", 'want {"by": STR, "target": STR, "until": EPOCH or null}: not carried out')]
        if problems:
            _remove(path)
            self.problems.report(now, f"control/{path.name}", problems)
            self.problems.said.pop(f"control/{path.name}", None)
            return
        try:
            if self.on_ack is not None:
                self.on_ack(now, str(target), None if until is None else float(until), str(by))
        except ValueError:
            pass  # names no open incident (any more): nothing to silence
        finally:
            _remove(path)

    def _retry(self, now: float, job: str, by: str) -> None:
        if not (self.queue.dir("failed") / job).exists():
            return  # refused: nothing happened, so no event (`plan retry` tells its caller where the job is)
        self.state.reset(job)
        self.queue.move(job, "failed", "queue")
        self.queue.emit(now, job, "retry", by=by, note="re-queued from failed/, attempts reset")

    def _cancel(self, now: float, job: str, by: str) -> None:
        for run in list(self.jobs.running.values()):
            if run.filename == job:
                pids = self.jobs.evict(now, run, "failed", f"cancelled by {by}", refund=False)
                self.state.failed(job, timestamp(now), None, f"cancelled by {by}")
                self.queue.emit(now, job, "cancelled", by=by, was="running", pids=pids)
                return
        try:
            os.unlink(self.queue.dir("queue") / job)
        except OSError:
            return  # refused (neither queued nor running): nothing happened, so no event
        self.forget(job)
        self.queue.emit(now, job, "cancelled", by=by, was="queued")

    def _parked(self, now: float) -> str:
        park = self.queue.root / PARK_FILE
        if not os.path.lexists(park):
            self.problems.report(now, PARK_FILE, [])
            return ""
        text = read_regular(str(park))
        if text is None:
            return "parked (parked.json unreadable)"
        try:
            reason, problems = check_park(json.loads(text))
        except ValueError as exc:
            reason, problems = "parked", [("(whole file)", f"not JSON ({exc}): parked without a reason")]
        self.problems.report(now, PARK_FILE, problems)
        return reason


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


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass
