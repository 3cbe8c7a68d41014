"""What one attempt of a plan job on Slurm leaves when it ends: ROOT/results/PLAN/NAME/ID.json, written by its
wrapper (runner.slurm.attempt) inside the allocation and folded into the ledger by the agent (runner.slurm.ledger).
Its own module: an attempt loads this record, not the ledger's (each of whose frozen dataclasses is made at import)."""

from __future__ import annotations

from runner.records import Frozen, fill_all
from runner.slurm.jsonfields import (
    COUNT,
    ID,
    OPT_FLOAT,
    OPT_INT,
    OPT_STR,
    STRINGS,
    Bad,
    Field,
    RecordError,
    read_fields,
    read_object,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from runner.slurm.jsonfields import SlurmId


class AttemptResult(Frozen):
    """What an attempt's wrapper (runner.slurm.attempt) left when it ended: ROOT/results/PLAN/NAME/ID.json."""

    __slots__ = (
        "id",
        "attempt",
        "start",
        "end",
        "kind",
        "state",
        "rc",
        "tail",
        "next_attempt",
        "next_id",
        "wait_s",
        "moved",
        "retry_due",
        "cause",
    )
    id: SlurmId
    attempt: int
    start: float | None
    end: float | None
    kind: str | None
    state: str | None
    rc: int | None
    tail: tuple[str, ...]
    next_attempt: int | None
    next_id: int | None  # the next try it submitted
    wait_s: float | None
    moved: tuple[str, ...]
    retry_due: float | None  # the next try it could not submit, due then
    cause: str | None  # why it did not count: FAILED, TIMEOUT, OUT_OF_MEMORY (the retry's cause)

    def __init__(
        self,
        id: SlurmId,
        attempt: int = 1,
        start: float | None = None,
        end: float | None = None,
        kind: str | None = None,
        state: str | None = None,
        rc: int | None = None,
        tail: tuple[str, ...] = (),
        next_attempt: int | None = None,
        next_id: int | None = None,
        wait_s: float | None = None,
        moved: tuple[str, ...] = (),
        retry_due: float | None = None,
        cause: str | None = None,
    ) -> None:
        fill_all(self, locals())

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
_RESULT_READ: dict[str, Field] = {
    "id": ID,
    "attempt": COUNT,
    "start": OPT_FLOAT,
    "end": OPT_FLOAT,
    "kind": OPT_STR,
    "state": OPT_STR,
    "rc": OPT_INT,
    "tail": STRINGS,
    "next_attempt": OPT_INT,
    "next_id": OPT_INT,
    "wait_s": OPT_FLOAT,
    "moved": STRINGS,
    "retry_due": OPT_FLOAT,
    "cause": OPT_STR,
}
_RESULT_KEYS = frozenset(_RESULT_READ)


def parse_result(value: Any, where: str = "") -> AttemptResult | RecordError:
    """The attempt result in VALUE (a result file's JSON), or where and why it is not one."""
    try:
        raw = read_object(value, _RESULT_KEYS)
        if "id" not in raw:
            raise Bad("", "no 'id'")
        return AttemptResult(**read_fields(raw, _RESULT_READ))
    except Bad as bad:
        return bad.within(where).error
