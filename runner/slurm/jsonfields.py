"""Reading JSON into the Slurm backend's typed records (runner.slurm.records, runner.slurm.bundle): one reader
per kind of field, an error located in the JSON it was read from (`plans.lf.jobs.p1.attempts[0].rc`).

A value already of its field's type is taken as it is; only another goes through its reader, and a place is
named only for a value that is wrong (each enclosing reader puts its key in front as the error passes up), so
a valid 10 000-job ledger spends nothing on names it never needs."""

from __future__ import annotations

from runner.records import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:  # a Slurm attempt, which reads its bundle element through these, loads no typing
    from typing import Any, Callable, Iterator, TypeVar, Union

    SlurmId = Union[int, str]  # a job's id, or ARRAY_N for an element of an array
    T = TypeVar("T")


class RecordError(Frozen):
    """Why a record read from JSON cannot be used, and where in it (`plans.lf.jobs.p1.attempts[0].id`)."""

    __slots__ = ("where", "message")
    where: str
    message: str

    def __init__(self, where: str, message: str) -> None:
        fill(self, "where", where)
        fill(self, "message", message)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class Bad(Exception):
    """Raised inside a parse, turned into a RecordError at its boundary. Its place is relative to the value that
    was being read (`[0]`, `tail[0]`) and each enclosing reader puts its own key in front as it passes through,
    so a valid record spends nothing on naming places it never needs."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message

    def within(self, outer: str) -> Bad:
        self.where = place(outer, self.where)
        return self

    @property
    def error(self) -> RecordError:
        return RecordError(self.where, self.message)


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def optional(check: Callable[[Any], T]) -> Callable[[Any], T | None]:
    def read(value: Any) -> T | None:
        return None if value is None else check(value)

    return read


def read_int(value: Any) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise Bad("", f"an integer was expected, not {kind_of(value)}")
    return value


def read_float(value: Any) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Bad("", f"a number was expected, not {kind_of(value)}")
    return float(value)


def read_str(value: Any) -> str:
    if not isinstance(value, str):
        raise Bad("", f"a string was expected, not {kind_of(value)}")
    return value


def read_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Bad("", f"true or false was expected, not {kind_of(value)}")
    return value


def read_id(value: Any) -> SlurmId:
    if isinstance(value, str) and value:
        return int(value) if value.isdigit() else value
    return read_int(value)


def read_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Bad("", f"a list was expected, not {kind_of(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise Bad(f"[{i}]", f"a string was expected, not {kind_of(item)}")
    return tuple(value)


def read_object(value: Any, known: frozenset[str] | None = None) -> dict[str, Any]:
    """VALUE as a JSON object, with no key outside KNOWN (None: any key, a mapping of names)."""
    if not isinstance(value, dict):
        raise Bad("", f"an object was expected, not {kind_of(value)}")
    if known is not None and not value.keys() <= known:
        raise Bad("", f"unknown key {sorted(value.keys() - known)[0]!r}")
    return value


class Field:
    """How one key is read: a value already of a type in PLAIN is taken as it is (the common case, and cheap), any
    other goes through READ, which converts it or says why it cannot."""

    __slots__ = ("plain", "read")

    def __init__(self, plain: tuple[type, ...], read: Callable[[Any], Any]) -> None:
        self.plain = plain
        self.read = read


def read_fields(raw: dict[str, Any], readers: dict[str, Field]) -> dict[str, Any]:
    """Each key of RAW read by its reader (every key has one: `read_object` checked), a bad one located."""
    out = {}
    for key, value in raw.items():
        field = readers[key]
        if type(value) in field.plain:
            out[key] = value
            continue
        try:
            out[key] = field.read(value)
        except Bad as bad:
            raise bad.within(key) from None
    return out


def read_each(items: Any, read: Callable[[Any], T]) -> Iterator[tuple[str, T]]:
    """(name, READ(value)) for each item of the JSON object ITEMS, a bad one located under its name."""
    for name, value in read_object(items or {}).items():
        try:
            yield name, read(value)
        except Bad as bad:
            raise bad.within(name) from None


def read_list(value: Any, read: Callable[[Any], T]) -> tuple[T, ...]:
    """READ(item) for each item of the JSON list VALUE, a bad one located under its index."""
    if not isinstance(value, list):
        raise Bad("", f"a list was expected, not {kind_of(value)}")
    found = []
    for i, item in enumerate(value):
        try:
            found.append(read(item))
        except Bad as bad:
            raise bad.within(f"[{i}]") from None
    return tuple(found)


def place(where: str, key: str) -> str:
    if not where or not key:
        return where or key
    return f"{where}{key}" if key.startswith("[") else f"{where}.{key}"


NULL = type(None)
opt_str, opt_int = optional(read_str), optional(read_int)
OPT_STR = Field((str, NULL), opt_str)
OPT_INT = Field((int, NULL), opt_int)
OPT_FLOAT = Field((float, NULL), optional(read_float))
OPT_ID = Field((int, NULL), optional(read_id))
ID = Field((int,), read_id)
STR_OR_EMPTY = Field((str,), lambda v: opt_str(v) or "")
COUNT = Field((), lambda v: opt_int(v) or 1)  # an attempt's number: null or 0 reads as 1
FLAG = Field((bool,), lambda v: bool(optional(read_bool)(v)))
STRINGS = Field((), read_strings)
