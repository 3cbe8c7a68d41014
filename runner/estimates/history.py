"""How long jobs took: ROOT/history.json, the durations of each job's and each family's last done runs (bounded).

The estimates (runner/eta.py) read it: a job that ran before is expected to take about as long again, and a job
that never ran about as long as the other jobs of its family (the plan's template or `foreach` entry, which push
records in manifest.json as the job's `family`). Only done runs count: a failure says nothing about a job's
length. The file is a cache of what events.jsonl also says, so it is written without fsync; it holds at most
MAX_JOBS jobs and MAX_FAMILIES families (the least recently run are dropped), a few hundred kB at worst.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.files import atomic_write, read_json

NAME = "history.json"
RUNS_PER_JOB = 5
RUNS_PER_FAMILY = 20
MAX_JOBS = 2000
MAX_FAMILIES = 500


def _runs(value: Any) -> list[float]:
    if not isinstance(value, list):
        return []
    return [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0]


def _entries(raw: Any) -> dict[str, dict[str, Any]]:
    """The well-formed entries of one table: name -> {runs, last[, family]}; anything else is dropped."""
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(raw, dict):
        return found
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        runs = _runs(entry.get("runs"))
        last = entry.get("last")
        if not runs or not isinstance(last, (int, float)) or isinstance(last, bool):
            continue
        clean: dict[str, Any] = {"runs": runs, "last": float(last)}
        if isinstance(entry.get("family"), str):
            clean["family"] = entry["family"]
        found[str(name)] = clean
    return found


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class History:
    """The durations of done runs, per job and per family."""

    def __init__(
        self, jobs: dict[str, dict[str, Any]] | None = None, families: dict[str, dict[str, Any]] | None = None
    ):
        self.jobs = jobs or {}
        self.families = families or {}

    @classmethod
    def parse(cls, raw: Any) -> History:
        """HISTORY.json's content as read; what is not well-formed is left out (it is a cache: never an error)."""
        if not isinstance(raw, dict):
            return cls()
        return cls(_entries(raw.get("jobs")), _entries(raw.get("families")))

    @classmethod
    def load(cls, root: Path) -> History:
        try:
            return cls.parse(read_json(Path(root) / NAME))
        except (OSError, ValueError):
            return cls()

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "jobs": self.jobs, "families": self.families}

    def save(self, root: Path) -> None:
        atomic_write(Path(root) / NAME, json.dumps(self.to_json(), separators=(",", ":")).encode(), durable=False)

    def record(self, job: str, family: str | None, seconds: float, now: float) -> None:
        """One done run of JOB (of FAMILY, if it has one) that took SECONDS."""
        _add(self.jobs, job, seconds, now, RUNS_PER_JOB, MAX_JOBS, family)
        if family:
            _add(self.families, family, seconds, now, RUNS_PER_FAMILY, MAX_FAMILIES, None)

    def expected(self, job: str, family: str | None = None) -> tuple[float, str] | None:
        """How long JOB is expected to run, and on what basis; None when neither it nor its family ran before."""
        entry = self.jobs.get(job)
        if entry:
            runs = entry["runs"]
            return median(runs), f"median of its last {_count(len(runs), 'run')}"
        family = family or (entry or {}).get("family")
        if family and family in self.families:
            runs = self.families[family]["runs"]
            return median(runs), f"median of {_count(len(runs), 'run')} of its family {family}"
        return None


def _add(
    table: dict[str, dict[str, Any]],
    name: str,
    seconds: float,
    now: float,
    keep: int,
    most: int,
    family: str | None,
) -> None:
    entry = table.pop(name, None) or {"runs": []}
    entry["runs"] = [*entry["runs"], round(seconds, 1)][-keep:]
    entry["last"] = round(now, 1)
    if family:
        entry["family"] = family
    table[name] = entry  # re-inserted last: the table is ordered by when each entry last ran
    while len(table) > most:
        del table[next(iter(table))]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"
