"""A Slurm host's status (SlurmStatus: its lanes, running and waiting jobs, counts) as runner.slurm.view builds it
and the workstation reads it (plancompiler.backends.slurm): status.json's shape, written with to_json and read
back with parse_status_answer into the same frozen values or a located error (`status.running[0].started: ...`).

Read on the workstation, which trusts no box: a key a newer agent adds is passed over, a known key of the wrong
kind is an error naming where it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from runner.slurm.jsonfields import (
    OPT_ID,
    Bad,
    Field,
    optional,
    read_each,
    read_fields,
    read_float,
    read_int,
    read_list,
    read_object,
    read_str,
)
from runner.slurm.jsonfields import RecordError as RecordError  # what a parse here answers: this door's too

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId

T = TypeVar("T")


@dataclass(frozen=True)
class Running:
    """A job Slurm runs now: its attempt, when it started and how its log grows."""

    job: str  # PLAN/NAME.job
    lane: str
    started: float
    slurm_id: SlurmId | None = None
    attempt: int = 1
    elapsed_s: float = 0.0
    log_size: int = 0
    log_grew_at: float | None = None
    last_line: str = ""
    pid: int | None = None  # the Slurm job's own number (squeue's JobID), where it has one
    warn_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "lane": self.lane,
            "pid": self.pid,
            "slurm_id": self.slurm_id,
            "attempt": self.attempt,
            "started": self.started,
            "elapsed_s": self.elapsed_s,
            "log_size": self.log_size,
            "log_grew_at": self.log_grew_at,
            "last_line": self.last_line,
            "warn_after_s": self.warn_after_s,
        }


@dataclass(frozen=True)
class Waiting:
    """A job that waits: why (runner.vocab's Reason, as its value), on what, and since when."""

    job: str
    reason: str
    lane: str = ""
    detail: str = ""
    blocker: str = ""  # the jobs it waits on, by PLAN/NAME where the ledger knows them
    since: float | None = None
    slurm_id: SlurmId | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "lane": self.lane,
            "reason": self.reason,
            "detail": self.detail,
            "blocker": self.blocker,
            "since": self.since,
            "slurm_id": self.slurm_id,
        }


@dataclass(frozen=True)
class Lane:
    """A lane as the runner shows one of slots: every job running in it (oldest first) and its start; `slots`
    where its licences count them."""

    state: str  # running or idle
    running: tuple[str, ...] = ()
    started: tuple[float, ...] = ()
    busy: int = 0
    since: float | None = None
    slots: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": self.state,
            "running": list(self.running),
            "started": list(self.started),
            "busy": self.busy,
            "since": self.since,
        }
        if self.slots is not None:
            out["slots"] = self.slots
        return out


@dataclass(frozen=True)
class Counts:
    queue: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0

    def to_json(self) -> dict[str, int]:
        return {"queue": self.queue, "running": self.running, "done": self.done, "failed": self.failed}


@dataclass(frozen=True)
class SlurmStatus:
    """What `plan status` shows of a Slurm root, in status.json's shape (its runner is Slurm: no pid, no tick)."""

    root: str
    heartbeat: float  # when the submit host looked
    lanes: dict[str, Lane] = field(default_factory=dict)
    running: tuple[Running, ...] = ()
    queued: tuple[Waiting, ...] = ()
    counts: Counts = Counts()

    def to_json(self) -> dict[str, Any]:
        runner = {"pid": None, "version": "slurm", "format_version": 1, "heartbeat": self.heartbeat, "tick": 0}
        return {
            "runner": {**runner, "root": self.root, "backend": "slurm"},
            "lanes": {name: lane.to_json() for name, lane in self.lanes.items()},
            "running": [item.to_json() for item in self.running],
            "queued": [item.to_json() for item in self.queued],
            "parked": None,
            "counts": self.counts.to_json(),
        }

    def answer(self) -> dict[str, Any]:
        """The agent's answer to `status` (runner.agent.handlers adds the events window)."""
        return {"status": self.to_json(), "runner_alive": True, "now": self.heartbeat, "counts": self.counts.to_json()}


_STR = Field((str,), read_str)
_NUMBER = Field((float, int), read_float)
_OPT_NUMBER = Field((float, int, type(None)), optional(read_float))
_INT = Field((int,), read_int)
_OPT_INT = Field((int, type(None)), optional(read_int))


def _strings(value: Any) -> tuple[str, ...]:
    return read_list(value, read_str)


def _numbers(value: Any) -> tuple[float, ...]:
    return read_list(value, read_float)


_RUNNING: dict[str, Field] = {
    "job": _STR,
    "lane": _STR,
    "started": _NUMBER,
    "slurm_id": OPT_ID,
    "attempt": _INT,
    "elapsed_s": _NUMBER,
    "log_size": _INT,
    "log_grew_at": _OPT_NUMBER,
    "last_line": _STR,
    "pid": _OPT_INT,
    "warn_after_s": _OPT_NUMBER,
}
_WAITING: dict[str, Field] = {
    "job": _STR,
    "reason": _STR,
    "lane": _STR,
    "detail": _STR,
    "blocker": _STR,
    "since": _OPT_NUMBER,
    "slurm_id": OPT_ID,
}
_LANE: dict[str, Field] = {
    "state": _STR,
    "running": Field((), _strings),
    "started": Field((), _numbers),
    "busy": _INT,
    "since": _OPT_NUMBER,
    "slots": _OPT_INT,
}
_COUNTS: dict[str, Field] = {"queue": _INT, "running": _INT, "done": _INT, "failed": _INT}


def _record(kind: Callable[..., T], readers: dict[str, Field], needed: tuple[str, ...]) -> Callable[[Any], T]:
    """A reader of one JSON object into KIND: its known keys read (others passed over), NEEDED ones there."""

    def read(value: Any) -> T:
        raw = read_object(value)
        missing = [key for key in needed if key not in raw]
        if missing:
            raise Bad("", f"no {missing[0]!r}")
        return kind(**read_fields({k: v for k, v in raw.items() if k in readers}, readers))

    return read


_read_running = _record(Running, _RUNNING, ("job", "lane", "started"))
_read_waiting = _record(Waiting, _WAITING, ("job", "reason"))
_read_lane = _record(Lane, _LANE, ("state",))
_read_counts = _record(Counts, _COUNTS, ())
_read_runner: Callable[[Any], dict[str, Any]] = _record(
    dict, {"root": _STR, "heartbeat": _NUMBER}, ("root", "heartbeat")
)  # Slurm's: the rest fixed


def _read_status(value: Any) -> SlurmStatus:
    raw = read_object(value)
    parts: dict[str, Any] = {}
    for key, read in (
        ("runner", _read_runner),
        ("lanes", lambda v: dict(read_each(v, _read_lane))),
        ("running", lambda v: read_list(v, _read_running)),
        ("queued", lambda v: read_list(v, _read_waiting)),
        ("counts", _read_counts),
    ):
        try:
            parts[key] = read(raw.get(key))
        except Bad as bad:
            raise bad.within(key) from None
    return SlurmStatus(**parts.pop("runner"), **parts)


def parse_status_answer(answer: Any) -> SlurmStatus | RecordError:
    """The status a Slurm agent answered (`status`: status.json's shape, `now`), or where in it and why it is
    not one. An answer that is an error ({"error": ...}) is the caller's to tell first."""
    try:
        raw = read_object(answer)
        try:
            read_float(raw.get("now"))
        except Bad as bad:
            raise bad.within("now") from None
        try:
            return _read_status(raw.get("status"))
        except Bad as bad:
            raise bad.within("status") from None
    except Bad as bad:
        return bad.error
