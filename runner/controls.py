"""Requests from `plan` (retry, cancel, hold, release, move, park --now, push --retry-failed) that the runner carries
out between ticks; and the park files (the whole queue, or lanes alone) it reads once a tick."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from runner.files import loads, read_regular
from runner.queue import Queue, timestamp
from runner.state import check_park, check_request
from runner.vocab import Event

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the annotations only: runner.jobs imports nothing of this module, and the agent's
    # handlers (which use the park files and request names here) load neither the job header's parser nor
    # the runner's state
    from runner import jobfile
    from runner.runstate import RunnerState
    from runner.service.jobs import Jobs
    from runner.service.problems import FileProblems
    from runner.state import Problem

# A control request is the file control/<action>-<target>, JSON {"by": ...} inside. The actions are a
# closed set with no '-' of their own, so the first '-' ends the action even when the job name has more.
CONTROL_ACTIONS = ("reset", "retry", "cancel", "requeue", "ack", "hold", "release", "move")
JOB_ACTIONS = ("reset", "retry", "cancel", "hold", "release", "move")  # those whose target is a job file
REQUEUE_RUNNING = "running"  # the target of `requeue`: every running job (park --now)
MOVES = ("first", "last", "before")  # a `move` request's `to`; `before` names the `other` job
# `ack-<token>` (`plan ack`): JSON {"by": ..., "target": "KIND[:PATTERN]", "until": EPOCH or null}; the token
# only makes the file name unique, the target is read from inside.
PARK_FILE = "parked.json"
PARKED_LANES_FILE = "parked-lanes.json"  # {lane: park_record}: lanes parked alone (`plan park HOST --lane L`)


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
        self,
        queue: Queue,
        state: RunnerState,
        problems: FileProblems,
        jobs: Jobs,
        forget: Callable[[str], None],
        queued: Callable[[], dict[str, jobfile.JobFile]] | None = None,
    ) -> None:
        self.queue = queue
        self.state = state
        self.problems = problems
        self.jobs = jobs
        self.forget = forget  # drops everything the runner knows about a queued job file
        self.queued = queued or dict  # the settled queued jobs as the last scan took them (to order a move)
        self.park = ""  # why the queue is parked, read once a tick; '' when it is not
        # The incident book's ack (runner.alerts.engine.Alerts.ack): (now, target, until, by).
        self.on_ack: Callable[[float, str, float | None, str], object] | None = None
        self.park_lanes: dict[str, str] = {}  # lane -> why it alone is parked

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
        lanes, before = self._parked_lanes(now), self.park_lanes
        self.park_lanes = lanes
        for lane in sorted(set(lanes) | set(before)):
            if lane in lanes and lane not in before:
                self.queue.emit(now, "-", Event.PARKED.value, why=lanes[lane], lane=lane)
            elif lane in before and lane not in lanes:
                self.queue.emit(now, "-", Event.UNPARKED.value, lane=lane)

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
            self._carry_out(now, action, job, request)
        finally:
            _remove(path)  # after the action, so `plan` reads "taken" as "done", and even if it failed

    def _carry_out(self, now: float, action: str, job: str, request: dict[str, str]) -> None:
        by = request["by"]
        if action in ("hold", "release", "move"):
            self._order(now, action, job, request)
        elif action == "reset":
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
            raw = loads(text or b"null")
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
                self.state.ended(job)
                self.queue.emit(now, job, "cancelled", by=by, was="running", pids=pids, **self.jobs.end_fields(run))
                return
        try:
            os.unlink(self.queue.dir("queue") / job)
        except OSError:
            return  # refused (neither queued nor running): nothing happened, so no event
        self.forget(job)
        self.state.ended(job)
        self.queue.emit(now, job, "cancelled", by=by, was="queued")

    def _order(self, now: float, action: str, job: str, request: dict[str, str]) -> None:
        """hold, release or move a queued job: state.json keeps it (across runner lives) and decide() judges it.
        Refused (nothing changes, no event) for a job that is not in queue/: `plan` says where it is."""
        if not os.path.exists(self.queue.dir("queue") / job):
            return
        if action == "hold":
            self.state.held[job] = {"by": request["by"], "since": timestamp(now)}
        elif action == "release":
            self.state.held.pop(job, None)
        else:
            found = self.queued()
            mine = found.get(job)
            if mine is None:
                from runner import jobfile

                data = read_regular(str(self.queue.dir("queue") / job))
                parsed = jobfile.parse(job, data or b"", self.jobs.config.lanes)
                if not isinstance(parsed, jobfile.JobFile):
                    return
                mine = parsed
            lane = [
                (name, self.state.priority.get(name, other.priority))
                for name, other in found.items()
                if other.lane == mine.lane
            ]
            lane.append((job, self.state.priority.get(job, mine.priority)))
            priority = moved_priority(lane, job, request["to"], request.get("other", ""))
            if priority is not None:
                self.state.priority[job] = priority

    def _parked_lanes(self, now: float) -> dict[str, str]:
        """Lane -> why it alone is parked, from parked-lanes.json ({lane: {since, reason, by}})."""
        path = self.queue.root / PARKED_LANES_FILE
        if not os.path.lexists(path):
            self.problems.report(now, PARKED_LANES_FILE, [])
            return {}
        text = read_regular(str(path))
        try:
            raw = loads(text) if text is not None else None
        except ValueError:
            raw = None
        if not isinstance(raw, dict):
            self.problems.report(now, PARKED_LANES_FILE, [("(whole file)", "expected an object of lanes: ignored")])
            return {}
        lanes: dict[str, str] = {}
        problems: list[Problem] = []
        for lane, record in raw.items():
            reason, wrong = check_park(record)
            lanes[lane] = f"lane {lane} {reason}"
            problems += [(f"{lane}.{key}", why) for key, why in wrong]
        self.problems.report(now, PARKED_LANES_FILE, problems)
        return lanes

    def _parked(self, now: float) -> str:
        park = self.queue.root / PARK_FILE
        if not os.path.lexists(park):
            self.problems.report(now, PARK_FILE, [])
            return ""
        text = read_regular(str(park))
        if text is None:
            return "parked (parked.json unreadable)"
        try:
            reason, problems = check_park(loads(text))
        except ValueError as exc:
            reason, problems = "parked", [("(whole file)", f"not JSON ({exc}): parked without a reason")]
        self.problems.report(now, PARK_FILE, problems)
        return reason


def _request(name: str, action: str, job: str, text: bytes | None) -> tuple[dict[str, str] | None, list[Problem]]:
    from runner import jobfile

    if action == "requeue":
        if job != "running":
            return None, [("(name)", f"unknown request {name!r}: requeue-running is the only requeue")]
    elif action not in JOB_ACTIONS:
        wanted = ", ".join(f"{a}-" for a in JOB_ACTIONS)
        return None, [("(name)", f"unknown request {name!r}: want {wanted}JOB or requeue-running")]
    elif not (job.endswith(".job") and jobfile.NAME_RE.match(jobfile.job_name(job)) and ".." not in job):
        return None, [("(name)", f"request {name!r} does not name a job file: not carried out")]
    if text is None:
        return None, [("(whole file)", "not a regular file: request not carried out")]
    try:
        raw = loads(text) if text.strip() else None
    except ValueError as exc:
        return None, [("(whole file)", f"not JSON ({exc}): request not carried out")]
    request, problems = check_request(raw)
    if request is not None and action == "move":
        return _move(raw)
    return request, problems


def _move(raw: object) -> tuple[dict[str, str] | None, list[Problem]]:
    """A move's body: `to` one of MOVES, and `other` (a job file) for `before`."""
    from runner import jobfile

    body = raw if isinstance(raw, dict) else {}
    to, other = body.get("to"), body.get("other", "")
    if to not in MOVES:
        return None, [("to", f"expected one of {', '.join(MOVES)}, got {to!r:.40}: request not carried out")]
    if to == "before" and not (isinstance(other, str) and other.endswith(".job") and jobfile.NAME_RE.match(other)):
        return None, [("other", f"`before` needs the job file it goes before, got {other!r:.40}: not carried out")]
    return {"by": str(body.get("by", "?")), "to": str(to), "other": str(other or "")}, []


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            import shutil  # here: it loads bz2 and lzma, and the agent's handlers use this module's names

            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


def moved_priority(lane: list[tuple[str, int]], job: str, to: str, other: str = "") -> int | None:
    """The priority that puts JOB first, last, or before OTHER among LANE's queued jobs ((name, priority), JOB's
    own included), its name unchanged; None when OTHER is not queued in that lane."""
    others = [(name, p) for name, p in lane if name != job]
    if to == "first":
        return max((p for _, p in others), default=0) + 1
    if to == "last":
        return min((p for _, p in others), default=0) - 1
    target = next((p for name, p in others if name == other), None)
    if target is None:
        return None
    return target if job < other else target + 1  # equal priorities go in name order
