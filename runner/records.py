"""The runner's records of jobs (a parsed queue file, a running job, a waiting job's reason), and the bases its
records are made of.

A dataclass generates and compiles its methods when its class is made (a frozen one ~4.6 M instructions, at every
start), and importing `dataclasses` loads inspect, ast, dis and tokenize (~79 M). The runner's records are
classes with __slots__ and their own __init__; `Record` and `Frozen` give what the dataclass did, from the slots'
names: equality with a record of its own class whose fields are equal (never with another class's), and
`Name(field=value)` as its repr; a frozen one is hashed by its fields and refuses assignment after __init__ (which
fills its slots through `fill`). A mutable one is unhashable, as a dataclass with eq=True is."""

from __future__ import annotations

import os

from runner.throttle import Throttle

TYPE_CHECKING = False
if TYPE_CHECKING:  # a Slurm attempt, whose records are made of Frozen, loads no typing
    from typing import Any, ClassVar, TypeVar

    from runner import jobfile
    from runner.conditions import Condition

    T = TypeVar("T", bound="Frozen")

fill = object.__setattr__  # a frozen record's own __init__ sets its slots past the refusal below


class Record:
    """A mutable record: equal by its fields, unhashable, shown with its fields."""

    __slots__: ClassVar[tuple[str, ...]] = ()

    def _names(self) -> tuple[str, ...]:
        """The fields compared and shown (a record may keep others of its own: a cache)."""
        return self.__slots__

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._names())

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self) or not isinstance(other, Record):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names())
        return f"{type(self).__qualname__}({shown})"


class Frozen(Record):
    """An immutable record: as Record, and hashable by its fields (where they are)."""

    __slots__: ClassVar[tuple[str, ...]] = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._values())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")


def fill_all(record: Frozen, given: dict[str, Any]) -> None:
    """Each of RECORD's slots filled from GIVEN (its __init__'s locals()): a frozen record of many fields says
    their names once more, in __slots__, not a third time."""
    for name in record.__slots__:
        fill(record, name, given[name])


def replaced(record: T, **changes: Any) -> T:
    """RECORD with CHANGES made, as a new record of its class (what dataclasses.replace did; __init__ is not run
    again: a field's value is taken as given)."""
    unknown = set(changes).difference(record.__slots__)
    if unknown:
        raise TypeError(f"{type(record).__qualname__} has no field {sorted(unknown)[0]!r}")
    new = object.__new__(type(record))
    for name in record.__slots__:
        fill(new, name, changes[name] if name in changes else getattr(record, name))
    return new


_U64 = (1 << 64) - 1


def file_key(st: os.stat_result) -> int:
    """What identifies a version of a file: its mtime, size and inode, as one exact number (10 000 queued jobs
    keep one each; a tuple of three was twice the size)."""
    return (st.st_mtime_ns & _U64) | st.st_size << 64 | st.st_ino << 128  # a pre-1970 mtime kept apart too


class Parsed:
    """A queue file as the scan took it (one per queued job, so in slots: 10 000 of them add up)."""

    __slots__ = ("key", "job", "requires", "done_if")

    def __init__(
        self,
        key: int,
        job: jobfile.JobFile | jobfile.Invalid,
        requires: Condition | None = None,
        done_if: Condition | None = None,
    ) -> None:
        self.key = key  # file_key of the file parsed
        self.job = job
        self.requires = requires
        self.done_if = done_if


class Running(Record):
    """A job this runner started and has not yet seen end."""

    __slots__ = (
        "filename",
        "job",
        "pid",
        "lane",
        "attempt",
        "started",
        "log_offset",
        "tag",
        "log_size",
        "log_grew_at",
        "cgroup",
        "timed_out",
        "gpus",
        "gpu_active_s",
        "gpu_watched_s",
        "gpu_still_s",
        "peak_kb",
        "usage",
        "announced",
    )

    def __init__(
        self,
        filename: str,
        job: jobfile.JobFile,
        pid: int,
        lane: str,
        attempt: int,
        started: float,
        log_offset: int,
        tag: str,
        log_size: int = 0,
        log_grew_at: float = 0.0,
        cgroup: str | None = None,
        timed_out: bool = False,
        gpus: tuple[int, ...] = (),
        gpu_active_s: float = 0.0,
        gpu_watched_s: float = 0.0,
        gpu_still_s: float = 0.0,
        peak_kb: int = 0,
        usage: dict[str, Any] | None = None,
        announced: Throttle | None = None,
    ) -> None:
        self.filename = filename
        self.job = job
        self.pid = pid
        self.lane = lane
        self.attempt = attempt
        self.started = started
        self.log_offset = log_offset
        self.tag = tag
        self.log_size = log_size
        self.log_grew_at = log_grew_at
        self.cgroup = cgroup
        self.timed_out = timed_out
        self.gpus = gpus  # the GPUs it was given (--gpus)
        self.gpu_active_s = gpu_active_s  # seconds its GPU engine time was seen moving ...
        self.gpu_watched_s = gpu_watched_s  # ... of the seconds it was watched on the GPU
        self.gpu_still_s = gpu_still_s  # how long its GPU engine time has not moved (0: moving, or not watched)
        self.peak_kb = peak_kb  # the largest resident memory of its processes together that a tick's sample saw
        self.usage = usage  # what it used (runner.service.accounting), once it ended
        self.announced = Throttle() if announced is None else announced  # long-running, stalled: this run's repeats


class Reason:
    """Why a queued job waits, since when (in slots; equal ones are shared by the jobs that have them, so it is
    replaced, never changed in place: runner.service.reasons)."""

    __slots__ = ("reason", "since", "detail", "blocker", "extra")

    def __init__(
        self, reason: str, since: float, detail: str = "", blocker: str = "", extra: dict[str, Any] | None = None
    ) -> None:
        self.reason = reason
        self.since = since
        self.detail = detail
        self.blocker = blocker
        self.extra: dict[str, Any] = {} if extra is None else extra

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reason):
            return NotImplemented
        mine = (self.reason, self.since, self.detail, self.blocker, self.extra)
        return mine == (other.reason, other.since, other.detail, other.blocker, other.extra)

    def __repr__(self) -> str:
        return f"Reason({self.reason!r}, {self.since!r}, {self.detail!r}, {self.blocker!r}, {self.extra!r})"
