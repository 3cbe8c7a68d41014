"""The Slurm backend's records, typed at the JSON boundary: the ledger (ROOT/slurm.json: plans, job records,
attempts), an attempt's result file (ROOT/results/PLAN/NAME/ID.json), and the rows squeue and sacct give.

Each is a frozen value, parsed once where it is read (`parse_ledger`, `parse_result`: a typed record or a
located error, never a half-read dict) and written with its own `to_json`. The ledger itself and its plans are
the one container edited under the push lock: a job record is replaced whole when an attempt changes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, TypeVar, Union

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
    """Raised inside a parse, turned into a RecordError at its boundary. Its place is relative to the value that
    was being read (`[0]`, `tail[0]`) and each enclosing reader puts its own key in front as it passes through,
    so a valid record spends nothing on naming places it never needs."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message

    def within(self, outer: str) -> _Bad:
        self.where = _key(outer, self.where)
        return self

    @property
    def error(self) -> RecordError:
        return RecordError(self.where, self.message)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _opt(check: Callable[[Any], T]) -> Callable[[Any], T | None]:
    def read(value: Any) -> T | None:
        return None if value is None else check(value)

    return read


def _int(value: Any) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _Bad("", f"an integer was expected, not {_kind(value)}")
    return value


def _float(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad("", f"a number was expected, not {_kind(value)}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad("", f"a string was expected, not {_kind(value)}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad("", f"true or false was expected, not {_kind(value)}")
    return value


def _slurm_id(value: Any) -> SlurmId:
    if isinstance(value, str) and value:
        return int(value) if value.isdigit() else value
    return _int(value)


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad("", f"a list was expected, not {_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _Bad(f"[{i}]", f"a string was expected, not {_kind(item)}")
    return tuple(value)


def _object(value: Any, known: frozenset[str] | None = None) -> dict[str, Any]:
    """VALUE as a JSON object, with no key outside KNOWN (None: any key, a mapping of names)."""
    if not isinstance(value, dict):
        raise _Bad("", f"an object was expected, not {_kind(value)}")
    if known is not None and not value.keys() <= known:
        raise _Bad("", f"unknown key {sorted(value.keys() - known)[0]!r}")
    return value


class _Field:
    """How one key is read: a value already of a type in PLAIN is taken as it is (the common case, and cheap), any
    other goes through READ, which converts it or says why it cannot."""

    __slots__ = ("plain", "read")

    def __init__(self, plain: tuple[type, ...], read: Callable[[Any], Any]) -> None:
        self.plain = plain
        self.read = read


def _fields(raw: dict[str, Any], readers: dict[str, _Field]) -> dict[str, Any]:
    """Each key of RAW read by its reader (every key has one: `_object` checked), a bad one located."""
    out = {}
    for key, value in raw.items():
        field = readers[key]
        if type(value) in field.plain:
            out[key] = value
            continue
        try:
            out[key] = field.read(value)
        except _Bad as bad:
            raise bad.within(key) from None
    return out


def _each(items: Any, read: Callable[[Any], T]) -> Iterator[tuple[str, T]]:
    """(name, READ(value)) for each item of the JSON object ITEMS, a bad one located under its name."""
    for name, value in _object(items or {}).items():
        try:
            yield name, read(value)
        except _Bad as bad:
            raise bad.within(name) from None


def _key(where: str, key: str) -> str:
    if not where or not key:
        return where or key
    return f"{where}{key}" if key.startswith("[") else f"{where}.{key}"


_NULL = type(None)
_opt_str, _opt_int = _opt(_str), _opt(_int)
_OPT_STR = _Field((str, _NULL), _opt_str)
_OPT_INT = _Field((int, _NULL), _opt_int)
_OPT_FLOAT = _Field((float, _NULL), _opt(_float))
_OPT_ID = _Field((int, _NULL), _opt(_slurm_id))
_ID = _Field((int,), _slurm_id)
_STR_OR_EMPTY = _Field((str,), lambda v: _opt_str(v) or "")
_COUNT = _Field((), lambda v: _opt_int(v) or 1)  # an attempt's number: null or 0 reads as 1
_FLAG = _Field((bool,), lambda v: bool(_opt(_bool)(v)))
_STRINGS = _Field((), _strings)


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


def _waits(value: Any) -> tuple[tuple[str, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad("", f"a list was expected, not {_kind(value)}")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise _Bad(f"[{i}]", "a [reason, time] pair was expected")
        for j, read in enumerate((_str, _float)):
            try:
                read(item[j])
            except _Bad as bad:
                raise bad.within(f"[{i}][{j}]") from None
        found.append((item[0], float(item[1])))
    return tuple(found)


_ATTEMPT_READ: dict[str, _Field] = {
    "id": _OPT_ID,
    "hash": _OPT_STR,
    "attempt": _COUNT,
    "submitted": _OPT_FLOAT,
    "state": _OPT_STR,
    "reason": _STR_OR_EMPTY,
    "start": _OPT_FLOAT,
    "end": _OPT_FLOAT,
    "eligible": _OPT_FLOAT,
    "result": _FLAG,
    "rc": _OPT_INT,
    "kind": _OPT_STR,
    "tail": _STRINGS,
    "wait_s": _OPT_FLOAT,
    "moved": _STRINGS,
    "retry_due": _OPT_FLOAT,
    "next_attempt": _OPT_INT,
    "next_id": _OPT_INT,
    "cause": _OPT_STR,
    "retried_by": _OPT_STR,
    "after": _OPT_STR,
    "bundle": _OPT_STR,
    "entry": _OPT_INT,
    "slurm_name": _OPT_STR,
    "waits": _Field((), _waits),
}
_ATTEMPT_KEYS = frozenset(_ATTEMPT_READ)


def _plain(value: Any) -> Any:
    """A tuple (of tuples) as JSON lists."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _attempt(value: Any) -> Attempt:
    raw = _object(value, _ATTEMPT_KEYS)
    if "id" not in raw:
        raise _Bad("", "no 'id'")
    # Absent keys take the dataclass's defaults, which are what each reader makes of null.
    return Attempt(**_fields(raw, _ATTEMPT_READ))


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


def _attempts(value: Any) -> tuple[Attempt, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Bad("", f"a list was expected, not {_kind(value)}")
    found = []
    for i, item in enumerate(value):
        try:
            found.append(_attempt(item))
        except _Bad as bad:
            raise bad.within(f"[{i}]") from None
    return tuple(found)


_RECORD_READ: dict[str, _Field] = {
    "hash": _OPT_STR,
    "lane": _STR_OR_EMPTY,
    "deps": _STRINGS,
    "slurm_name": _OPT_STR,
    "attempts": _Field((), _attempts),
}
_RECORD_KEYS = frozenset(_RECORD_READ)


def _record(value: Any) -> JobRecord:
    return JobRecord(**_fields(_object(value, _RECORD_KEYS), _RECORD_READ))


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


_PLAN_READ: dict[str, _Field] = {
    "jobs": _Field((), lambda v: dict(_each(v, _record))),
    "by": _OPT_STR,
    "pushed_at": _OPT_STR,
    "lanes": _Field((), lambda v: dict(_each(v, _strings))),
}
_PLAN_KEYS = frozenset(_PLAN_READ)


def _plan(value: Any) -> PlanEntry:
    return PlanEntry(**_fields(_object(value, _PLAN_KEYS), _PLAN_READ))


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


_LEDGER_READ: dict[str, _Field] = {
    "version": _Field((int,), _int),
    "generation": _Field((), lambda v: _opt_int(v) or 0),
    "plans": _Field((), lambda v: dict(_each(_object(v), _plan))),
    "seen": _Field((), lambda v: {mark: bool(done) for mark, done in _object(v or {}).items()}),
}
_LEDGER_KEYS = frozenset(_LEDGER_READ)


def parse_ledger(value: Any) -> Ledger | RecordError:
    """The ledger in VALUE (slurm.json's JSON), or where and why it is not one this version wrote."""
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return RecordError("", f"not a version-{VERSION} ledger")
    try:
        if value.get("plans") is None:
            raise _Bad("plans", "an object was expected, not null")
        fields = _fields(_object(value, _LEDGER_KEYS), _LEDGER_READ)
    except _Bad as bad:
        return bad.error
    del fields["version"]
    return Ledger(**fields)


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
_RESULT_READ: dict[str, _Field] = {
    "id": _ID,
    "attempt": _COUNT,
    "start": _OPT_FLOAT,
    "end": _OPT_FLOAT,
    "kind": _OPT_STR,
    "state": _OPT_STR,
    "rc": _OPT_INT,
    "tail": _STRINGS,
    "next_attempt": _OPT_INT,
    "next_id": _OPT_INT,
    "wait_s": _OPT_FLOAT,
    "moved": _STRINGS,
    "retry_due": _OPT_FLOAT,
    "cause": _OPT_STR,
}
_RESULT_KEYS = frozenset(_RESULT_READ)


def parse_result(value: Any, where: str = "") -> AttemptResult | RecordError:
    """The attempt result in VALUE (a result file's JSON), or where and why it is not one."""
    try:
        raw = _object(value, _RESULT_KEYS)
        if "id" not in raw:
            raise _Bad("", "no 'id'")
        return AttemptResult(**_fields(raw, _RESULT_READ))
    except _Bad as bad:
        return bad.within(where).error


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
