"""Why each queued job is not running: one `Reason` per job, kept while it lasts (its `since` is when it began)."""

from __future__ import annotations

import sys
from collections.abc import ItemsView
from typing import Any

from runner import procs
from runner.records import Reason
from runner.runstate import RunnerState

# The extra fields of most reasons: none. One dict shared by them all (10 000 empty dicts were 0.6 MB); a reason's
# extra is replaced, never changed in place.
_NO_EXTRA: dict[str, Any] = {}
# More jobs than this changed since waiting.json listed them all: it is written whole at the next sweep, whichever
# they are, and they are no longer kept (100,000 names at a first tick, beside `changed`'s own)
UNLISTED_MAX = 10000


class Reasons:
    """Owns the table of reasons; the scheduler's actions, the scan and the launcher set them."""

    def __init__(self, state: RunnerState) -> None:
        self.state = state
        self.table: dict[str, Reason] = {}
        self.generation = 0  # changes whenever any reason (or its detail, blocker, since) does: status.json's cue
        self.by_reason: dict[str, int] = {}  # how many jobs wait for each reason, kept as reasons change
        # Jobs whose reason changed (or went) since status.json was written (heartbeat.json carries their entries)
        self.changed: set[str] = set()
        # Of those status.json counted, what it said: (reason, blocker) (status.json's summary is moved on by them,
        # each from its group to its new one: runner.views.waiting.patch)
        self.was: dict[str, tuple[str, str]] = {}
        # Jobs whose reason changed (or went) since waiting.json listed every waiting job (status.json carries their
        # entries until the list is written whole again: runner.service.statusfile); None: more than UNLISTED_MAX
        self.unlisted: set[str] | None = set()
        # Reasons are never changed in place but replaced, so equal ones are one object: 100 000 jobs waiting for
        # their lane since the same tick share one (most of a queue's reasons are such).
        self._shared: dict[tuple[str, float, str, str], Reason] = {}

    def written(self) -> None:
        """status.json shows every reason as it is now."""
        self.changed.clear()
        self.was.clear()

    def listed(self) -> None:
        """waiting.json lists every reason as it is now."""
        self.unlisted = set()

    def _change(self, filename: str) -> None:
        if filename not in self.changed:
            current = self.table.get(filename)
            if current is not None:  # a job status.json did not count is in `changed` alone (100,000 at a first tick)
                self.was[filename] = (current.reason, current.blocker)
            self.changed.add(filename)
        if self.unlisted is not None:
            self.unlisted.add(filename)
            if len(self.unlisted) > UNLISTED_MAX:
                self.unlisted = None
        self.generation += 1

    def retaken(self, filename: str) -> None:
        """FILENAME was read again (its file changed): its entry is written again, its lane maybe another."""
        if filename in self.table:
            self._change(filename)

    def get(self, filename: str) -> Reason | None:
        return self.table.get(filename)

    def items(self) -> ItemsView[str, Reason]:
        """Every job's reason, as the table holds them (no list of 100,000 pairs made per reader): a reader
        changes no reason while it goes through them."""
        return self.table.items()

    def __contains__(self, filename: object) -> bool:
        return filename in self.table

    def __getitem__(self, filename: str) -> Reason:
        return self.table[filename]

    def drop(self, filename: str) -> None:
        if filename in self.table:
            self._change(filename)
            self._count(self.table.pop(filename).reason, -1)

    def keep_only(self, live: set[str]) -> None:
        for filename in [f for f in self.table if f not in live]:
            self.drop(filename)

    def _count(self, reason: str, step: int) -> None:
        count = self.by_reason.get(reason, 0) + step
        if count:
            self.by_reason[reason] = count
        else:
            self.by_reason.pop(reason, None)

    def _since(self, filename: str, since: float) -> None:
        reason = self.table[filename]
        if reason.since != since:
            self._change(filename)
            self.table[filename] = self._reason(reason.reason, since, reason.detail, reason.blocker, reason.extra)

    def _reason(self, reason: str, since: float, detail: str, blocker: str, extra: dict[str, Any]) -> Reason:
        """A Reason of these values: the one kept for them where there are no extra fields."""
        if extra:
            return Reason(reason, since, detail, blocker, extra)
        key = (reason, since, detail, blocker)
        found = self._shared.get(key)
        if found is None:
            if len(self._shared) >= 4096:
                self._shared = {}  # the jobs keep theirs
            found = self._shared[key] = Reason(reason, since, detail, blocker, _NO_EXTRA)
        return found

    def set(self, now: float, filename: str, reason: str, detail: str, blocker: str = "", **extra: Any) -> None:
        if len(detail) < 256:  # the same words for many jobs ("X is running in cpu"): one string kept for all
            detail = sys.intern(detail)
        current = self.table.get(filename)
        if current and current.reason == reason and current.blocker == blocker:
            if current.detail != detail or current.extra != extra:
                self._change(filename)
                self.table[filename] = self._reason(reason, current.since, detail, blocker, extra or _NO_EXTRA)
            return
        since = now
        if reason == "requires":
            since = self.state.waiting_since.get(filename, now)
        self._change(filename)
        if current is not None:
            self._count(current.reason, -1)
        self._count(reason, 1)
        self.table[filename] = self._reason(reason, since, detail, blocker, extra or _NO_EXTRA)

    def requires_false(self, now: float, filename: str, requires: str, blocked: tuple[str, str, str] | None) -> None:
        """REQUIRES is false: `blocked` where the manifest shows it never can hold, else `requires`, timed from
        when it was first seen false (kept in state.json across runner lives)."""
        since = self.state.waiting_since.get(filename)
        if since is None:
            since = self.state.waiting_since[filename] = now
        if blocked:
            path, producer, failure = blocked
            self.set(now, filename, "blocked", failure, producer or path, path=path, producer=producer)
            self._since(filename, min(self.table[filename].since, now))
            return
        # Which test is false is not kept: the REQUIRES text is what a user reads, and 10 000 details cost 2 MB.
        self.set(now, filename, "requires", requires, requires)
        self._since(filename, since)

    def gpu_foreign(
        self, now: float, filename: str, first: procs.GpuUser, left_by: str | None, gpu: int | None = None
    ) -> None:
        origin = f", left by job {left_by}" if left_by else ""
        on = f"GPU {gpu}: " if gpu is not None else ""
        self.set(
            now,
            filename,
            "gpu-foreign",
            f"{on}pid {first.pid} ({first.why}{origin}): {first.cmd[:120]}",
            f"pid {first.pid}",
            pid=first.pid,
            cmd=first.cmd[:200],
            left_by=left_by,
            **({"gpu": gpu} if gpu is not None else {}),
        )
