"""The runner's records of jobs: a parsed queue file, a running job, a waiting job's reason."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from runner import jobfile
from runner.conditions import Condition
from runner.throttle import Throttle

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


@dataclass
class Running:
    filename: str
    job: jobfile.JobFile
    pid: int
    lane: str
    attempt: int
    started: float
    log_offset: int
    tag: str
    log_size: int = 0
    log_grew_at: float = 0.0
    cgroup: str | None = None
    timed_out: bool = False
    gpus: tuple[int, ...] = ()  # the GPUs it was given (--gpus)
    gpu_active_s: float = 0.0  # seconds its GPU engine time was seen moving ...
    gpu_watched_s: float = 0.0  # ... of the seconds it was watched on the GPU
    gpu_still_s: float = 0.0  # how long its GPU engine time has not moved (0: moving, or not watched)
    peak_kb: int = 0  # the largest resident memory of its processes together that a tick's sample saw
    usage: dict[str, Any] | None = None  # what it used (runner.service.accounting), once it ended
    announced: Throttle = field(default_factory=Throttle)  # long-running, stalled: this run's repeats


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
