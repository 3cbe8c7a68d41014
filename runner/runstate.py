"""The runner's memory across lives: state.json as one typed, versioned value (read through runner.state's checks)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.queue import Queue
from runner.records import Record

if TYPE_CHECKING:
    from runner.state import Problem

# state.json carries "version"; a file without it (every runner before this field) reads as version 1.
STATE_VERSION = 1


class RunnerState(Record):
    """What the runner keeps of each job across its lives (a record: runner.records; equal and shown by its tables,
    not by what was last saved)."""

    __slots__ = (
        "attempts",
        "waiting_since",
        "backoff_until",
        "last_failure",
        "held",
        "priority",
        "_saved",
        "_saved_key",
    )

    def __init__(
        self,
        attempts: dict[str, int] | None = None,
        waiting_since: dict[str, float] | None = None,
        backoff_until: dict[str, float] | None = None,
        last_failure: dict[str, dict[str, Any]] | None = None,
        held: dict[str, dict[str, Any]] | None = None,
        priority: dict[str, int] | None = None,
    ) -> None:
        self.attempts: dict[str, int] = {} if attempts is None else attempts  # job -> attempts used
        # job -> when its REQUIRES was first false
        self.waiting_since: dict[str, float] = {} if waiting_since is None else waiting_since
        self.backoff_until: dict[str, float] = {} if backoff_until is None else backoff_until  # job -> no retry before
        # job -> {ts, rc, summary}
        self.last_failure: dict[str, dict[str, Any]] = {} if last_failure is None else last_failure
        self.held: dict[str, dict[str, Any]] = {} if held is None else held  # job -> {by, since}: `plan hold`
        self.priority: dict[str, int] = {} if priority is None else priority  # job -> its priority as `plan move` set
        self._saved: tuple[dict[str, Any], ...] | None = None
        self._saved_key: tuple[int, int, int] | None = None

    def _names(self) -> tuple[str, ...]:
        return self.__slots__[:6]

    @classmethod
    def load(cls, queue: Queue) -> tuple[RunnerState, list[Problem]]:
        checked, problems = queue.load_state()
        return cls(**checked), problems

    def adopt(self, other: RunnerState) -> None:
        """Take OTHER's contents in place: the runner's parts hold this object, not a copy."""
        self.attempts, self.waiting_since = other.attempts, other.waiting_since
        self.backoff_until, self.last_failure = other.backoff_until, other.last_failure
        self.held, self.priority = other.held, other.priority

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "attempts": self.attempts,
            "waiting_since": self.waiting_since,
            "backoff_until": self.backoff_until,
            "last_failure": self.last_failure,
            "held": self.held,
            "priority": self.priority,
        }

    def save(self, queue: Queue) -> None:
        """Written when it differs from what was last written (a dict comparison is far cheaper than encoding
        10 000 waiting jobs' times every tick)."""
        now = self._copy()
        if now == self._saved and _key(queue.state_path) == self._saved_key:  # and the file is still ours
            return
        queue.save_state(self.to_json())
        self._saved, self._saved_key = now, _key(queue.state_path)

    def _copy(self) -> tuple[dict[str, Any], ...] | None:
        return (
            dict(self.attempts),
            dict(self.waiting_since),
            dict(self.backoff_until),
            {k: dict(v) if isinstance(v, dict) else v for k, v in self.last_failure.items()},
            {k: dict(v) for k, v in self.held.items()},
            dict(self.priority),
        )

    def reset(self, job: str) -> None:
        """Everything known about JOB, forgotten (`plan retry`, push --retry-failed)."""
        for table in (self.attempts, self.backoff_until, self.last_failure, self.waiting_since):
            table.pop(job, None)

    def ended(self, job: str) -> None:
        """JOB left the queue for good (done, failed, cancelled): its hold and its moved priority are over."""
        self.held.pop(job, None)
        self.priority.pop(job, None)

    def refund(self, job: str) -> None:
        """The attempt in progress did not count (the runner, not the job, ended it)."""
        if self.attempts.get(job, 0) > 0:
            self.attempts[job] -= 1

    def failed(self, job: str, ts: str, rc: int | None, summary: str) -> None:
        self.last_failure[job] = {"ts": ts, "rc": rc, "summary": summary}


def _key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
