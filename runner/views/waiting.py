"""The waiting queue at a glance (a view model): queued jobs grouped by reason and blocker, with counts and the
oldest few, for `plan status`, `runner status` and `plan top`. No printing here: `runner.views.status` lays it out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Worst first: what can never run, then what waits on something outside the plan.
REASON_ORDER = (
    "blocked",
    "disk-full",
    "gpu-foreign",
    "exclusive",
    "parked",
    "backoff",
    "stale",
    "requires",
    "settling",
    "lane-busy",
    "order",
    "held",  # what the operator asked for: last
)
# A reason whose jobs wait on more distinct blockers than this is one group (each job's detail says its own).
MAX_BLOCKERS = 3
ELLIPSIS = "…"


@dataclass(frozen=True)
class Waiter:
    job: str
    lane: str | None
    since: float
    detail: str


@dataclass(frozen=True)
class WaitGroup:
    """Queued jobs that wait for one reason on one blocker ("" when each waits on its own: its detail)."""

    reason: str
    blocker: str
    count: int
    oldest: tuple[Waiter, ...]  # the longest waiting first


def waiter(item: Mapping[str, Any], now: float) -> Waiter:
    since = item.get("since")
    return Waiter(
        str(item.get("job", "?")),
        item.get("lane") if isinstance(item.get("lane"), str) else None,
        float(since) if isinstance(since, (int, float)) else now,
        str(item.get("detail") or ""),
    )


def group_waiting(queued: Iterable[Mapping[str, Any]], now: float, oldest: int = 3) -> list[WaitGroup]:
    """QUEUED (status.json's entries) grouped by reason, then by blocker where a reason has few of them; worst
    reason first, then the largest group; each group's OLDEST longest-waiting jobs."""
    by_reason: dict[str, dict[str, list[Waiter]]] = {}
    for item in queued:
        reason = str(item.get("reason") or "?")
        blocker = str(item.get("blocker") or "")
        by_reason.setdefault(reason, {}).setdefault(blocker, []).append(waiter(item, now))
    rank = {r: i for i, r in enumerate(REASON_ORDER)}
    groups: list[WaitGroup] = []
    for reason in sorted(by_reason, key=lambda r: (rank.get(r, len(rank)), r)):
        blockers = by_reason[reason]
        if len(blockers) > MAX_BLOCKERS or reason == "requires":
            blockers = {"": [w for waiters in blockers.values() for w in waiters]}  # each job's detail says why
        found = []
        for blocker, waiters in blockers.items():
            waiters.sort(key=lambda w: (w.since, w.job))
            found.append(WaitGroup(reason, blocker, len(waiters), tuple(waiters[:oldest])))
        groups += sorted(found, key=lambda g: (-g.count, g.blocker))
    return groups


def every_waiter(queued: Iterable[Mapping[str, Any]], now: float) -> list[tuple[str, Waiter]]:
    """`--all`: every queued job with its reason, worst reason first, then the longest waiting."""
    rank = {r: i for i, r in enumerate(REASON_ORDER)}
    found = [(str(item.get("reason") or "?"), waiter(item, now)) for item in queued]
    return sorted(found, key=lambda rw: (rank.get(rw[0], len(rank)), rw[1].since, rw[1].job))


def cut_middle(text: str, width: int) -> str:
    """TEXT at most WIDTH characters, cut in the middle: the end of a path (the file name that tells two
    conditions apart) and the start of a command both survive."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 3
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + text[len(text) - tail :]
