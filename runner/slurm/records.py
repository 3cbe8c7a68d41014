"""The Slurm backend's records, typed at the JSON boundary: the ledger (ROOT/slurm.json: plans, job records,
attempts) and the rows squeue and sacct give (an attempt's result file is runner.slurm.result's).

Each is a frozen value, parsed once where it is read (`parse_ledger`: a typed record or a located error, never a
half-read dict) and written with its own `to_json`. The ledger itself and its plans are
the one container edited under the push lock: a job record is replaced whole when an attempt changes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Union

from runner.slurm.jsonfields import (
    COUNT,
    FLAG,
    OPT_FLOAT,
    OPT_ID,
    OPT_INT,
    OPT_STR,
    STR_OR_EMPTY,
    STRINGS,
    Bad,
    Field,
    RecordError,
    kind_of,
    opt_int,
    read_each,
    read_fields,
    read_float,
    read_int,
    read_list,
    read_object,
    read_str,
    read_strings,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId

VERSION = 2


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
        raise Bad("", f"a list was expected, not {kind_of(value)}")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise Bad(f"[{i}]", "a [reason, time] pair was expected")
        for j, read in enumerate((read_str, read_float)):
            try:
                read(item[j])
            except Bad as bad:
                raise bad.within(f"[{i}][{j}]") from None
        found.append((item[0], float(item[1])))
    return tuple(found)


_ATTEMPT_READ: dict[str, Field] = {
    "id": OPT_ID,
    "hash": OPT_STR,
    "attempt": COUNT,
    "submitted": OPT_FLOAT,
    "state": OPT_STR,
    "reason": STR_OR_EMPTY,
    "start": OPT_FLOAT,
    "end": OPT_FLOAT,
    "eligible": OPT_FLOAT,
    "result": FLAG,
    "rc": OPT_INT,
    "kind": OPT_STR,
    "tail": STRINGS,
    "wait_s": OPT_FLOAT,
    "moved": STRINGS,
    "retry_due": OPT_FLOAT,
    "next_attempt": OPT_INT,
    "next_id": OPT_INT,
    "cause": OPT_STR,
    "retried_by": OPT_STR,
    "after": OPT_STR,
    "bundle": OPT_STR,
    "entry": OPT_INT,
    "slurm_name": OPT_STR,
    "waits": Field((), _waits),
}
_ATTEMPT_KEYS = frozenset(_ATTEMPT_READ)


def _plain(value: Any) -> Any:
    """A tuple (of tuples) as JSON lists."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _attempt(value: Any) -> Attempt:
    raw = read_object(value, _ATTEMPT_KEYS)
    if "id" not in raw:
        raise Bad("", "no 'id'")
    # Absent keys take the dataclass's defaults, which are what each reader makes of null.
    return Attempt(**read_fields(raw, _ATTEMPT_READ))


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
    return () if value is None else read_list(value, _attempt)


_RECORD_READ: dict[str, Field] = {
    "hash": OPT_STR,
    "lane": STR_OR_EMPTY,
    "deps": STRINGS,
    "slurm_name": OPT_STR,
    "attempts": Field((), _attempts),
}
_RECORD_KEYS = frozenset(_RECORD_READ)


def _record(value: Any) -> JobRecord:
    return JobRecord(**read_fields(read_object(value, _RECORD_KEYS), _RECORD_READ))


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


_PLAN_READ: dict[str, Field] = {
    "jobs": Field((), lambda v: dict(read_each(v, _record))),
    "by": OPT_STR,
    "pushed_at": OPT_STR,
    "lanes": Field((), lambda v: dict(read_each(v, read_strings))),
}
_PLAN_KEYS = frozenset(_PLAN_READ)


def _plan(value: Any) -> PlanEntry:
    return PlanEntry(**read_fields(read_object(value, _PLAN_KEYS), _PLAN_READ))


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


_LEDGER_READ: dict[str, Field] = {
    "version": Field((int,), read_int),
    "generation": Field((), lambda v: opt_int(v) or 0),
    "plans": Field((), lambda v: dict(read_each(read_object(v), _plan))),
    "seen": Field((), lambda v: {mark: bool(done) for mark, done in read_object(v or {}).items()}),
}
_LEDGER_KEYS = frozenset(_LEDGER_READ)


def parse_ledger(value: Any) -> Ledger | RecordError:
    """The ledger in VALUE (slurm.json's JSON), or where and why it is not one this version wrote."""
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return RecordError("", f"not a version-{VERSION} ledger")
    try:
        if value.get("plans") is None:
            raise Bad("plans", "an object was expected, not null")
        fields = read_fields(read_object(value, _LEDGER_KEYS), _LEDGER_READ)
    except Bad as bad:
        return bad.error
    del fields["version"]
    return Ledger(**fields)


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
