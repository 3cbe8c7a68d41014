"""manifest.json as the runner reads it: checked whenever it changes, and the queue's job lists, once a tick."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from runner.queue import Queue
from runner.service.problems import FileProblems
from runner.state import JobEntry, compact_names


def compact(manifest: dict[str, Any]) -> dict[str, Any]:
    """MANIFEST (checked) as the runner keeps it: each job's entry in slots, the producers' lists as tuples, and
    without `plans` (each plan's own copy of its jobs' entries, which the runner never reads: push does). Of the
    producers, only the paths some job's REQUIRES names: the runner looks a producer up for nothing else (why a
    REQUIRES is `blocked`, whether a `requires` wait is on a job in flight), and a queue of jobs that require
    nothing kept a dict and a tuple per output for nothing (12 MB at 100,000). The jobs' table is the one read
    where its names are interned already (the first read of a runner's life: json made one table, not two)."""
    kept = {key: value for key, value in manifest.items() if key != "plans"}
    jobs = manifest.get("jobs", {})
    if not all(sys.intern(name) is name and isinstance(entry, JobEntry) for name, entry in jobs.items()):
        jobs = {
            sys.intern(name): entry if isinstance(entry, JobEntry) else JobEntry(entry) for name, entry in jobs.items()
        }
    kept["jobs"] = jobs
    required = {path for entry in jobs.values() for path in entry.get("requires") or ()}
    producers = manifest.get("producers", {})
    kept["producers"] = {
        sys.intern(path): compact_names(names) for path, names in producers.items() if path in required
    }
    return kept


class Manifest:
    def __init__(self, queue: Queue, problems: FileProblems) -> None:
        self.queue = queue
        self.problems = problems
        self._cache: tuple[tuple[int, int, int], dict[str, Any] | None] | None = None
        self._read_this_tick = False
        self._presence: tuple[set[str], set[str]] | None = None
        self.now = 0.0  # the tick in progress, for the events a changed manifest raises

    def new_tick(self, now: float) -> None:
        """Forget this tick's reads, then read (and check) the manifest whenever it changed."""
        self._read_this_tick = False
        self._presence = None
        self.now = now
        self.get()

    def get(self) -> dict[str, Any] | None:
        if self._read_this_tick:
            return self._cache[1] if self._cache else None
        self._read_this_tick = True
        try:
            st = os.stat(self.queue.manifest_path)
        except OSError:
            self._cache = None
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._cache is None or self._cache[0] != key:
            self._cache = None  # let go of the last one first: two of 100 000 jobs would stand at once
            manifest, problems = self.queue.read_manifest(compact=True)
            self._cache = (key, compact(manifest) if manifest is not None else None)
            self.problems.report(self.now, "manifest.json", problems)
        return self._cache[1]

    def key(self) -> tuple[int, int, int] | None:
        """What identifies the manifest read this tick (it changes when the file does)."""
        return self._cache[0] if self._cache else None

    def slots(self) -> dict[str, int]:
        """Lane -> slots the pushed plans (or their hosts file entries) ask for; what is not a count >= 1 is left
        out (the runner's --slots flag overrides these)."""
        found = (self.get() or {}).get("slots")
        if not isinstance(found, dict):
            return {}
        return {lane: n for lane, n in found.items() if isinstance(n, int) and not isinstance(n, bool) and n >= 1}

    def gpus(self, lane: str) -> list[int]:
        """The GPUs the pushed plans (or their hosts file entries) give LANE (lanes.gpu.devices, gpus:); [] where
        none says, or what is said is not a list of distinct indexes (the runner's --gpus overrides)."""
        lanes = (self.get() or {}).get("gpus")
        found = lanes.get(lane) if isinstance(lanes, dict) else None
        if not isinstance(found, list) or len(set(found)) != len(found):
            return []
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1024 for n in found):
            return []
        return list(found)

    def sha(self, filename: str) -> str | None:
        """The sha256 push listed for FILENAME (the settle rule takes such a file at once)."""
        entry = (self.get() or {}).get("jobs", {}).get(filename)
        return entry.get("sha") if isinstance(entry, Mapping) else None

    def presence(self) -> tuple[set[str], set[str]]:
        """(failed, queued-running-or-done) job files, listed once per tick."""
        if self._presence is None:
            self._presence = (
                set(self.queue.list_all("failed")),
                set(self.queue.list_all("queue"))
                | set(self.queue.list_all("running"))
                | set(self.queue.list_all("done")),
            )
        return self._presence
