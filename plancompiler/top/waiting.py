"""Waiting jobs grouped by what holds them (reason and blocker), worst first, with counts and the oldest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Worst first: what can never run, then what waits on something outside the plan (as runner/status.py orders them).
REASON_ORDER = (
    "blocked",
    "disk-full",
    "gpu-foreign",
    "exclusive",
    "parked",
    "stale",
    "backoff",
    "requires",
    "settling",
    "lane-busy",
    "order",
)


@dataclass(frozen=True)
class WaitGroup:
    reason: str
    blocker: str
    jobs: tuple[str, ...]  # in name order: the order the runner takes them in
    oldest_since: float | None
    detail: str  # the oldest job's detail

    @property
    def count(self) -> int:
        return len(self.jobs)


def group_waiting(queued: list[dict[str, Any]], merge: int = 3) -> list[WaitGroup]:
    """QUEUED (status.json's entries) grouped by (reason, blocker): worst reason first, then the most jobs. Where
    MERGE or more jobs of one reason each wait on a blocker of their own (a REQUIRES file each), they are one group
    of that reason with no blocker, the oldest's detail standing for them."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in queued:
        if not isinstance(item, dict) or not isinstance(item.get("job"), str):
            continue
        key = (str(item.get("reason") or "?"), str(item.get("blocker") or ""))
        groups.setdefault(key, []).append(item)
    alone: dict[str, list[tuple[str, str]]] = {}
    for key, items in groups.items():
        if len(items) == 1:
            alone.setdefault(key[0], []).append(key)
    for reason, keys in alone.items():
        if len(keys) >= merge:
            groups[(reason, "")] = [item for key in keys for item in groups.pop(key)] + groups.get((reason, ""), [])
    order = {reason: i for i, reason in enumerate(REASON_ORDER)}
    found = []
    for (reason, blocker), items in groups.items():
        oldest = min(items, key=lambda q: (_since(q) if _since(q) is not None else float("inf"), q["job"]))
        jobs = tuple(sorted(q["job"] for q in items))
        found.append(WaitGroup(reason, blocker, jobs, _since(oldest), str(oldest.get("detail") or "")))
    found.sort(key=lambda g: (order.get(g.reason, len(order)), -g.count, g.blocker))
    return found


def _since(item: dict[str, Any]) -> float | None:
    since = item.get("since")
    return float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else None
