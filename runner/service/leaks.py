"""Processes that escaped their job (env -i, setsid) and came back to the runner, its subreaper; whose they are.

Every process orphaned from a job's tree is re-parented to the runner, so a child of the runner that is not
a running job's wrapper is a leak from some job. Its start time (/proc/PID/stat, in clock ticks since boot)
names the job whose lifetime contains it; when none or several do, it is `-`, "left by a job".
"""

from __future__ import annotations

import os
from typing import NamedTuple

from runner import procs
from runner.records import Record

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
LIFETIMES_KEPT = 200


def start_ticks(pid: int) -> int | None:
    """When PID started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
        return int(text[text.rfind(")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def now_ticks() -> int:
    try:
        with open("/proc/uptime") as handle:
            return int(float(handle.read().split()[0]) * CLK_TCK) + 1
    except (OSError, ValueError, IndexError):
        return 0


class Lifetime(Record):
    __slots__ = ("job", "start", "end")

    def __init__(self, job: str, start: int, end: int | None = None) -> None:
        self.job = job
        self.start = start  # clock ticks since boot
        self.end = end  # None while it runs


class Leak(NamedTuple):
    pid: int
    cmd: str
    job: str  # the job whose lifetime holds its start, or "-"
    group: tuple[int, ...]  # the leak and its descendants


def find(lifetimes: list[Lifetime], leaders: set[int], stats: dict[int, procs.Stat] | None = None) -> list[Leak]:
    """Live children of this process that are not job wrappers in LEADERS, each with its descendants (STATS:
    the stat of every process, or of this one's descendants, as read this tick: no other is looked at)."""
    me = os.getpid()
    stats = procs.all_stats() if stats is None else stats
    table = {pid: ppid for pid, (ppid, _, state, *_) in stats.items() if state not in ("Z", "X")}
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    leaks = []
    for top in children.get(me, []):
        if top in leaders:
            continue
        group, todo = [], [top]
        while todo:
            pid = todo.pop()
            group.append(pid)
            todo.extend(children.get(pid, []))
        proc = procs.read_proc(top)
        cmd = proc.cmdline if proc else "?"
        leaks.append(Leak(top, cmd, owner(lifetimes, start_ticks(top)), tuple(group)))
    return leaks


def owner(lifetimes: list[Lifetime], started: int | None) -> str:
    if started is None:
        return "-"
    jobs = {life.job for life in lifetimes if life.start <= started and (life.end is None or started <= life.end)}
    return jobs.pop() if len(jobs) == 1 else "-"
