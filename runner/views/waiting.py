"""The waiting queue at a glance (a view model): queued jobs grouped by reason and blocker, with counts and the
oldest few, for `plan status`, `runner status` and `plan top`. No printing here: `runner.views.status` lays it out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from runner.estimates import PER_LANE
from runner.records import Frozen, fill

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


class Waiter(NamedTuple):
    job: str
    lane: str | None
    since: float
    detail: str


class WaitGroup(Frozen):
    """Queued jobs that wait for one reason on one blocker ("" when each waits on its own: its detail; a frozen
    record: runner.records)."""

    __slots__ = ("reason", "blocker", "count", "oldest")
    reason: str
    blocker: str
    count: int
    oldest: tuple[Waiter, ...]  # the longest waiting first

    def __init__(self, reason: str, blocker: str, count: int, oldest: tuple[Waiter, ...]) -> None:
        fill(self, "reason", reason)
        fill(self, "blocker", blocker)
        fill(self, "count", count)
        fill(self, "oldest", oldest)


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
    groups = Grouping(now, oldest)
    for item in queued:
        groups.add(item)
    return groups.groups()


class Grouping:
    """group_waiting one entry at a time, in memory that does not grow with the queue: per reason and blocker a
    count and the OLDEST longest-waiting (the runner groups its 10 000 waiting jobs as it writes them out)."""

    def __init__(self, now: float, oldest: int = 3) -> None:
        self.now = now
        self.oldest = oldest
        self.count = 0
        # reason -> [count, its oldest, {blocker: [count, its oldest]} or None once it has too many blockers]
        self._reasons: dict[str, list[Any]] = {}

    def add(self, item: Mapping[str, Any]) -> None:
        self.count += 1
        reason = str(item.get("reason") or "?")
        blocker = str(item.get("blocker") or "")
        since = item.get("since")
        # (since, job) first: most entries are not among the oldest, and their Waiter is never made (100,000 a
        # sweep at 100,000 queued)
        order = (float(since) if isinstance(since, (int, float)) else self.now, str(item.get("job", "?")))
        entry = self._reasons.get(reason)
        if entry is None:
            entry = self._reasons[reason] = [0, [], {} if reason != "requires" else None]
        entry[0] += 1
        self._keep(entry[1], order, item)
        blockers = entry[2]
        if blockers is not None:
            one = blockers.get(blocker)
            if one is None:
                if len(blockers) >= MAX_BLOCKERS:  # each job's detail says why: one group for the reason
                    entry[2] = None
                    return
                one = blockers[blocker] = [0, []]
            one[0] += 1
            self._keep(one[1], order, item)

    def _keep(self, kept: list[tuple[float, str, Waiter]], order: tuple[float, str], item: Mapping[str, Any]) -> None:
        """ITEM among KEPT, the OLDEST longest-waiting (ORDER: its since, then name), in that order."""
        if len(kept) >= self.oldest and order >= kept[-1][:2]:
            return
        key = (*order, waiter(item, self.now))
        at = len(kept)
        while at and key[:2] < kept[at - 1][:2]:
            at -= 1
        kept.insert(at, key)
        del kept[self.oldest :]

    def groups(self) -> list[WaitGroup]:
        """Worst reason first, then the largest group."""
        rank = {r: i for i, r in enumerate(REASON_ORDER)}
        found: list[WaitGroup] = []
        for reason in sorted(self._reasons, key=lambda r: (rank.get(r, len(rank)), r)):
            count, kept, blockers = self._reasons[reason]
            if blockers is None:
                found.append(WaitGroup(reason, "", count, tuple(k[2] for k in kept)))
                continue
            part = [WaitGroup(reason, b, n, tuple(k[2] for k in ks)) for b, (n, ks) in blockers.items()]
            found += sorted(part, key=lambda g: (-g.count, g.blocker))
        return found


class Summary:
    """What `plan status` shows of the waiting jobs without --all, made one entry at a time from status's entries
    in the order the runner takes them: `waiting_count`, `waiting_groups` (group_waiting's, as JSON) and
    `queued_first` (each lane's first PER_LANE entries: what the estimated starts read). The runner writes it into
    status.json (runner.service.statusfile); the host agent makes it from the whole list of an older runner's."""

    def __init__(self, now: float, per_lane: int = PER_LANE) -> None:
        self.grouping = Grouping(now)
        self.per_lane = per_lane
        self.first: list[Mapping[str, Any]] = []
        self._shown: dict[str, int] = {}

    def add(self, item: Mapping[str, Any]) -> None:
        self.grouping.add(item)
        lane = str(item.get("lane"))
        if self._shown.get(lane, 0) < self.per_lane:
            self._shown[lane] = self._shown.get(lane, 0) + 1
            self.first.append(item)

    def result(self) -> dict[str, Any]:
        return {
            "waiting_count": self.grouping.count,
            "waiting_groups": [
                {
                    "reason": g.reason,
                    "blocker": g.blocker,
                    "count": g.count,
                    "oldest": [{"job": w.job, "lane": w.lane, "since": w.since, "detail": w.detail} for w in g.oldest],
                }
                for g in self.grouping.groups()
            ],
            "queued_first": list(self.first),
        }


def patch(
    groups: Any, count: Any, changed: list[Any], gone: list[Any], was: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], int] | None:
    """A summary's GROUPS and COUNT (status.json's `waiting_groups` and `waiting_count`, as of its list) moved on by
    the entries judged since (heartbeat.json's: CHANGED replaces a job's entry, GONE ends its wait; WAS, what the
    list said of each, its reason and blocker): each leaves the group it was counted in and joins the one of its
    new reason and blocker. A group's oldest lose the jobs that left it (the next oldest are known at the next
    list); None where the summary is not one."""
    if not isinstance(groups, list) or not isinstance(count, int) or not all(isinstance(g, dict) for g in groups):
        return None
    found = [dict(g, oldest=[w for w in g.get("oldest") or [] if isinstance(w, dict)]) for g in groups]

    def group(reason: str, blocker: str) -> dict[str, Any] | None:
        exact = [g for g in found if g.get("reason") == reason and g.get("blocker") == blocker]
        merged = [g for g in found if g.get("reason") == reason and not g.get("blocker")]
        return exact[0] if exact else merged[0] if merged else None

    entries = [e for e in changed if isinstance(e, dict) and isinstance(e.get("job"), str)]
    moved = {e["job"] for e in entries} | {job for job in gone if isinstance(job, str)}
    for job in moved:
        old = was.get(job)
        left = group(str(old[0]), str(old[1])) if isinstance(old, list) and len(old) == 2 else None
        if left is not None and isinstance(left.get("count"), int):
            left["count"] -= 1
            count -= 1
    for g in found:
        g["oldest"] = [w for w in g["oldest"] if w.get("job") not in moved]
    for entry in entries:
        reason, blocker = str(entry.get("reason") or "?"), str(entry.get("blocker") or "")
        joined = group(reason, blocker)
        if joined is None:
            joined = {"reason": reason, "blocker": "" if reason == "requires" else blocker, "count": 0, "oldest": []}
            found.append(joined)
        joined["count"] = int(joined.get("count") or 0) + 1
        count += 1
        w = waiter(entry, 0.0)
        joined["oldest"].append({"job": w.job, "lane": w.lane, "since": w.since, "detail": w.detail})
        joined["oldest"] = sorted(joined["oldest"], key=_longest)[:3]
    rank = {r: i for i, r in enumerate(REASON_ORDER)}
    kept = _merged([g for g in found if isinstance(g.get("count"), int) and g["count"] > 0])
    kept.sort(key=lambda g: (rank.get(str(g["reason"]), len(rank)), str(g["reason"]), -g["count"], str(g["blocker"])))
    return kept, max(count, 0)


def _longest(waiter: Mapping[str, Any]) -> tuple[float, str]:
    """The longest waiting first (a summary's `oldest`), then by name."""
    return (waiter.get("since") or 0.0, str(waiter.get("job")))


def _merged(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GROUPS with a reason's groups made one where it has more than MAX_BLOCKERS blockers, as group_waiting makes
    them (each job's detail says why)."""
    by_reason: dict[Any, list[dict[str, Any]]] = {}
    for g in groups:
        by_reason.setdefault(g.get("reason"), []).append(g)
    out: list[dict[str, Any]] = []
    for reason, same in by_reason.items():
        if len(same) <= MAX_BLOCKERS:
            out += same
            continue
        oldest = sorted((w for g in same for w in g["oldest"]), key=_longest)[:3]
        out.append({"reason": reason, "blocker": "", "count": sum(g["count"] for g in same), "oldest": oldest})
    return out


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
