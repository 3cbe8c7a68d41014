"""The Slurm backend's records, typed at the JSON boundary: the ledger (ROOT/slurm.json: plans, job records,
attempts), an attempt's result file (ROOT/results/PLAN/NAME/ID.json), and the rows squeue and sacct give.

Each is a frozen value, parsed once where it is read (`parse_ledger`, `parse_result`: a typed record or a
located error, never a half-read dict) and written with its own `to_json`. The ledger itself and its plans are
the one container edited under the push lock: a job record is replaced whole when an attempt changes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, TypeVar, Union

SlurmId = Union[int, str]  # a job's id, or ARRAY_N for an element of an array
VERSION = 2
T = TypeVar("T")


@dataclass(frozen=True)
class RecordError:
    """Why a record read from JSON cannot be used, and where in it (`plans.lf.jobs.p1.attempts[0].id`)."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class _Bad(Exception):
    """Raised inside a parse, turned into a RecordError at its boundary."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.error = RecordError(where, message)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _opt(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def read(value: Any, where: str) -> T | None:
        return None if value is None else check(value, where)

    return read


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(where, f"an integer was expected, not {_kind(value)}")
    return value


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(where, f"a number was expected, not {_kind(value)}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(where, f"a string was expected, not {_kind(value)}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(where, f"true or false was expected, not {_kind(value)}")
    return value


def _slurm_id(value: Any, where: str) -> SlurmId:
    if isinstance(value, str) and value:
        return int(value) if value.isdigit() else value
    return _int(value, where)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad(where, f"a list was expected, not {_kind(value)}")
    return tuple(_str(item, f"{where}[{i}]") for i, item in enumerate(value))


def _object(value: Any, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(where, f"an object was expected, not {_kind(value)}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise _Bad(where, f"unknown key {unknown[0]!r}")
    return value


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


@dataclass(frozen=True)
class Attempt:
    """One Slurm job of a plan job: its id, the content it ran, and what is known of how it went."""

    id: SlurmId | None  # None: a job a push prepared that nothing accounts for (runner.slurm.rebuild's LOST)
    hash: str | None = None
    attempt: int = 1
    submitted: float | None = None
    state: str | None = None  # Slurm's final state once known (or GATED, LOST)
    reason: str = ""  # Slurm's reason with that final state, or why a push cancelled it
    start: float | None = None
    end: float | None = None
    eligible: float | None = None
    result: bool = False  # its result file has been folded in: the fields below are its wrapper's
    rc: int | None = None
    kind: str | None = None  # done, failed, timeout, gated: the wrapper's word for how it ended
    tail: tuple[str, ...] = ()
    wait_s: float | None = None  # the backoff before its next try
    moved: tuple[str, ...] = ()  # the pending dependents its wrapper re-pointed to its next try
    retry_due: float | None = None  # its wrapper could not submit the next try: due at this time
    next_attempt: int | None = None
    next_id: int | None = None  # the next try the agent submitted for it (runner.slurm.retry)
    cause: str | None = None  # why that next try was needed (OUT_OF_MEMORY, TIMEOUT, FAILED ...)
    retried_by: str | None = None
    after: str | None = None  # how the attempt before this one ended (failed, timeout, gated, an OOM ...)
    bundle: str | None = None  # where its spec is: the push's bundle and its entry there
    entry: int | None = None
    slurm_name: str | None = None  # an array element's: the array's Slurm job name
    waits: tuple[tuple[str, float], ...] = ()  # each reason squeue gave while it pended, and when first seen

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "hash": self.hash,
            "attempt": self.attempt,
            "submitted": self.submitted,
            "state": self.state,
        }
        for name, default in _ATTEMPT_OPTIONAL:
            value = getattr(self, name)
            if value != default:
                out[name] = _plain(value)
        return out


_ATTEMPT_OPTIONAL: tuple[tuple[str, Any], ...] = (
    ("reason", ""),
    ("start", None),
    ("end", None),
    ("eligible", None),
    ("result", False),
    ("rc", None),
    ("kind", None),
    ("tail", ()),
    ("wait_s", None),
    ("moved", ()),
    ("retry_due", None),
    ("next_attempt", None),
    ("next_id", None),
    ("cause", None),
    ("retried_by", None),
    ("after", None),
    ("bundle", None),
    ("entry", None),
    ("slurm_name", None),
    ("waits", ()),
)
_ATTEMPT_READ: dict[str, Callable[[Any, str], Any]] = {
    "id": _opt(_slurm_id),
    "hash": _opt(_str),
    "submitted": _opt(_float),
    "state": _opt(_str),
    "reason": lambda v, w: _opt(_str)(v, w) or "",
    "start": _opt(_float),
    "end": _opt(_float),
    "eligible": _opt(_float),
    "result": lambda v, w: bool(_opt(_bool)(v, w)),
    "rc": _opt(_int),
    "kind": _opt(_str),
    "tail": _strings,
    "wait_s": _opt(_float),
    "moved": _strings,
    "retry_due": _opt(_float),
    "next_attempt": _opt(_int),
    "next_id": _opt(_int),
    "cause": _opt(_str),
    "retried_by": _opt(_str),
    "after": _opt(_str),
    "bundle": _opt(_str),
    "entry": _opt(_int),
    "slurm_name": _opt(_str),
    "waits": lambda v, w: _waits(v, w),
}


def _waits(value: Any, where: str) -> tuple[tuple[str, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad(where, f"a list was expected, not {_kind(value)}")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise _Bad(f"{where}[{i}]", "a [reason, time] pair was expected")
        found.append((_str(item[0], f"{where}[{i}][0]"), _float(item[1], f"{where}[{i}][1]")))
    return tuple(found)


def _plain(value: Any) -> Any:
    """A tuple (of tuples) as JSON lists."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _attempt(value: Any, where: str) -> Attempt:
    raw = _object(value, where, ("attempt", *_ATTEMPT_READ))
    if "id" not in raw:
        raise _Bad(where, "no 'id'")
    fields = {key: read(raw.get(key), _key(where, key)) for key, read in _ATTEMPT_READ.items()}
    return Attempt(attempt=_opt(_int)(raw.get("attempt"), _key(where, "attempt")) or 1, **fields)


@dataclass(frozen=True)
class JobRecord:
    """A plan job in the ledger: its content hash, lane and producers, and every Slurm job it has been, oldest
    first (the last is its current one)."""

    hash: str | None = None
    lane: str = ""
    deps: tuple[str, ...] = ()
    slurm_name: str | None = None  # PLAN/NAME, the name its own Slurm jobs carry
    attempts: tuple[Attempt, ...] = ()

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def with_current(self, attempt: Attempt) -> JobRecord:
        """This record with its current attempt replaced by ATTEMPT."""
        return replace(self, attempts=(*self.attempts[:-1], attempt))

    def with_attempt(self, attempt: Attempt) -> JobRecord:
        """This record with ATTEMPT as its new current one."""
        return replace(self, attempts=(*self.attempts, attempt))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hash": self.hash, "lane": self.lane, "deps": list(self.deps)}
        if self.slurm_name is not None:
            out["slurm_name"] = self.slurm_name
        out["attempts"] = [a.to_json() for a in self.attempts]
        return out


def _record(value: Any, where: str) -> JobRecord:
    raw = _object(value, where, ("hash", "lane", "deps", "slurm_name", "attempts"))
    attempts = raw.get("attempts") or []
    if not isinstance(attempts, list):
        raise _Bad(_key(where, "attempts"), f"a list was expected, not {_kind(attempts)}")
    return JobRecord(
        hash=_opt(_str)(raw.get("hash"), _key(where, "hash")),
        lane=_opt(_str)(raw.get("lane"), _key(where, "lane")) or "",
        deps=_strings(raw.get("deps"), _key(where, "deps")),
        slurm_name=_opt(_str)(raw.get("slurm_name"), _key(where, "slurm_name")),
        attempts=tuple(_attempt(a, f"{where}.attempts[{i}]") for i, a in enumerate(attempts)),
    )


@dataclass
class PlanEntry:
    """One plan's part of the ledger: its job records, who pushed it last and when, and each lane's licences."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    by: str | None = None
    pushed_at: str | None = None
    lanes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"jobs": {name: record.to_json() for name, record in self.jobs.items()}}
        if self.by is not None:
            out.update(by=self.by, pushed_at=self.pushed_at)
        if self.lanes:
            out["lanes"] = {lane: list(wanted) for lane, wanted in self.lanes.items()}
        return out


def _plan(value: Any, where: str) -> PlanEntry:
    raw = _object(value, where, ("jobs", "by", "pushed_at", "lanes"))
    jobs = _object(raw.get("jobs") or {}, _key(where, "jobs"), tuple(raw.get("jobs") or ()))
    lanes = _object(raw.get("lanes") or {}, _key(where, "lanes"), tuple(raw.get("lanes") or ()))
    return PlanEntry(
        jobs={name: _record(record, f"{where}.jobs.{name}") for name, record in jobs.items()},
        by=_opt(_str)(raw.get("by"), _key(where, "by")),
        pushed_at=_opt(_str)(raw.get("pushed_at"), _key(where, "pushed_at")),
        lanes={lane: _strings(wanted, f"{where}.lanes.{lane}") for lane, wanted in lanes.items()},
    )


@dataclass
class Ledger:
    """ROOT/slurm.json (runner.slurm.ledger): every plan pushed to the root, and the attempt ends already
    recorded as events (`seen`, so each is recorded once)."""

    generation: int = 0
    plans: dict[str, PlanEntry] = field(default_factory=dict)
    seen: dict[str, bool] = field(default_factory=dict)

    def plan(self, name: str) -> PlanEntry:
        """PLAN's entry, made empty if the ledger has none yet."""
        return self.plans.setdefault(name, PlanEntry())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "generation": self.generation,
            "plans": {name: entry.to_json() for name, entry in self.plans.items()},
            "seen": dict(self.seen),
        }


def parse_ledger(value: Any) -> Ledger | RecordError:
    """The ledger in VALUE (slurm.json's JSON), or where and why it is not one this version wrote."""
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return RecordError("", f"not a version-{VERSION} ledger")
    try:
        raw = _object(value, "", ("version", "generation", "plans", "seen"))
        plans = _object(raw.get("plans"), "plans", tuple(raw.get("plans") or ()))
        seen = _object(raw.get("seen") or {}, "seen", tuple(raw.get("seen") or ()))
        return Ledger(
            generation=_opt(_int)(raw.get("generation"), "generation") or 0,
            plans={name: _plan(entry, f"plans.{name}") for name, entry in plans.items()},
            seen={mark: bool(done) for mark, done in seen.items()},
        )
    except _Bad as bad:
        return bad.error


@dataclass(frozen=True)
class AttemptResult:
    """What an attempt's wrapper (runner.slurm.attempt) left when it ended: ROOT/results/PLAN/NAME/ID.json."""

    id: SlurmId
    attempt: int = 1
    start: float | None = None
    end: float | None = None
    kind: str | None = None
    state: str | None = None
    rc: int | None = None
    tail: tuple[str, ...] = ()
    next_attempt: int | None = None
    next_id: int | None = None  # the next try it submitted
    wait_s: float | None = None
    moved: tuple[str, ...] = ()
    retry_due: float | None = None  # the next try it could not submit, due then
    cause: str | None = None  # why it did not count: FAILED, TIMEOUT, OUT_OF_MEMORY (the retry's cause)

    @property
    def why(self) -> str | None:
        """How the attempt before a next try ended, in that try's `after` (failed, timeout, out_of_memory, gated)."""
        return (self.cause or self.kind or "").lower() or None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "attempt": self.attempt}
        for name in _RESULT_WRITTEN:
            value = getattr(self, name)
            if value is not None and value != ():
                out[name] = list(value) if isinstance(value, tuple) else value
        if self.retry_due is not None:
            out["retry_due"] = self.retry_due
        return out


_RESULT_WRITTEN = ("start", "end", "kind", "state", "rc", "tail", "next_attempt", "next_id", "wait_s", "moved", "cause")
_RESULT_READ: dict[str, Callable[[Any, str], Any]] = {
    "start": _opt(_float),
    "end": _opt(_float),
    "kind": _opt(_str),
    "state": _opt(_str),
    "rc": _opt(_int),
    "tail": _strings,
    "next_attempt": _opt(_int),
    "next_id": _opt(_int),
    "wait_s": _opt(_float),
    "moved": _strings,
    "retry_due": _opt(_float),
    "cause": _opt(_str),
}


def parse_result(value: Any, where: str = "") -> AttemptResult | RecordError:
    """The attempt result in VALUE (a result file's JSON), or where and why it is not one."""
    try:
        raw = _object(value, where, ("id", "attempt", *_RESULT_READ))
        if "id" not in raw:
            raise _Bad(where, "no 'id'")
        fields = {key: read(raw.get(key), _key(where, key)) for key, read in _RESULT_READ.items()}
        return AttemptResult(
            id=_slurm_id(raw["id"], _key(where, "id")),
            attempt=_opt(_int)(raw.get("attempt"), _key(where, "attempt")) or 1,
            **fields,
        )
    except _Bad as bad:
        return bad.error


@dataclass(frozen=True)
class LiveJob:
    """One row of squeue (runner.slurm.query.squeue): a plan job Slurm still knows, with Slurm's own clocks."""

    id: SlurmId  # as the ledger names it: ARRAY_N for an array's element
    job_id: str  # Slurm's own JobID (an array element's is a number of its own)
    name: str
    state: str
    reason: str
    plan: str
    hash: str  # what follows PLAN@ in its comment (an array's: array.SHA[:its element names])
    dependency: str
    start: float | None
    end: float | None
    eligible: float | None
    submitted: float | None
    restarts: int
    workdir: str


@dataclass(frozen=True)
class Accounted:
    """One allocation line of sacct: what accounting says of a job squeue has forgotten."""

    id: SlurmId
    state: str
    reason: str
    start: float | None
    end: float | None
    eligible: float | None


Seen = Union[LiveJob, Accounted]  # what Slurm says of an attempt, from squeue or sacct
