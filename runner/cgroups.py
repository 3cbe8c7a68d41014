"""cgroup v2, the stronger form of process ownership where the runner has a delegated subtree: a child per job,
ended at once by cgroup.kill."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def cgroup_usable(path: str) -> bool:
    """True when PATH is a cgroup v2 directory we may create children in (Linux 5.14+ gives them cgroup.kill)."""
    return (
        os.path.isfile(os.path.join(path, "cgroup.procs"))
        and os.access(path, os.W_OK)
        and os.path.isfile(os.path.join(path, "cgroup.max.descendants"))
    )


def own_cgroup() -> str | None:
    """This process's cgroup v2 directory (for --cgroup auto under a unit with Delegate=yes)."""
    try:
        line = next(ln for ln in open("/proc/self/cgroup").read().splitlines() if ln.startswith("0::"))
        mounts = [ln.split()[1] for ln in open("/proc/mounts").read().splitlines() if ln.split()[2] == "cgroup2"]
    except (OSError, StopIteration, IndexError):
        return None
    for mount in mounts:
        path = os.path.join(mount, line[3:].lstrip("/"))
        if os.path.isdir(path):
            return path
    return None


def cgroup_pids(path: str) -> list[int]:
    try:
        return [int(p) for p in open(os.path.join(path, "cgroup.procs")).read().split()]
    except (OSError, ValueError):
        return []


def cgroup_kill(path: str, timeout_s: float, reap: Callable[[], None]) -> list[int]:
    """Kill everything in the job's cgroup at once (cgroup.kill), wait for it to empty, remove it."""
    pids = cgroup_pids(path)
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as handle:
            handle.write("1")
    except OSError:
        return pids
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cgroup_pids(path):
        reap()
        time.sleep(0.02)
    try:
        os.rmdir(path)
    except OSError:
        pass
    return pids
