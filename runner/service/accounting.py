"""Accounting: what one run of a job used (CPU time of its tree, peak memory, GPU where it can be told), carried
by its end event the way Slurm's sacct carries TotalCPU and MaxRSS.

CPU time: the job's cgroup's cpu.stat where it has one (every process that ever ran in it), else the rusage
the kernel hands back when the runner reaps the job's wrapper: the wrapper's and every descendant it (or they)
waited for, which is the whole tree of a job that does not leave processes behind. Peak memory: the cgroup's
memory.peak where it has one, else the largest sum of the tree's resident memory seen by a sample (one a tick)
or the largest single process's peak from rusage, whichever is more: a peak shorter than a tick is still seen.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from runner.records import Running

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


class ReapedUsage(NamedTuple):
    """The rusage of a reaped wrapper, as much of it as accounting reads: its tree's CPU and largest RSS."""

    cpu_s: float
    maxrss_kb: int


def from_rusage(usage: Any) -> ReapedUsage:
    """What accounting reads of a `resource.struct_rusage` (ru_maxrss is in KiB on Linux)."""
    return ReapedUsage(float(usage.ru_utime + usage.ru_stime), int(usage.ru_maxrss))


def rss_kb(pids: list[int]) -> int:
    """The resident memory of PIDS together, from /proc/PID/statm (one short read each); gone ones count 0."""
    total = 0
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fields = os.read(fd, 256).split()
            total += int(fields[1]) * _PAGE_KB
        except (OSError, IndexError, ValueError):
            pass
        finally:
            os.close(fd)
    return total


def _cgroup_file(cgroup: str, name: str) -> str | None:
    try:
        with open(os.path.join(cgroup, name)) as handle:
            return handle.read()
    except OSError:
        return None


def cgroup_cpu_s(cgroup: str) -> float | None:
    """Seconds of CPU every process of the cgroup used (cpu.stat's usage_usec; present without a controller)."""
    text = _cgroup_file(cgroup, "cpu.stat")
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            try:
                return int(value) / 1e6
            except ValueError:
                return None
    return None


def cgroup_peak_kb(cgroup: str) -> int | None:
    """memory.peak in KiB, where the memory controller is on for the job's cgroup (Linux 5.19+)."""
    text = _cgroup_file(cgroup, "memory.peak")
    try:
        return int(text) // 1024 if text is not None else None
    except ValueError:
        return None


class CgroupUsage(NamedTuple):
    """A job cgroup's counters, read as its job ends (before the cgroup is removed)."""

    cpu_s: float | None
    peak_kb: int | None


def read_cgroup(cgroup: str | None) -> CgroupUsage | None:
    return CgroupUsage(cgroup_cpu_s(cgroup), cgroup_peak_kb(cgroup)) if cgroup else None


def end_fields(reaped: ReapedUsage | None, sampled_kb: int, cgroup: CgroupUsage | None) -> dict[str, Any]:
    """`cpu_s` and `peak_rss_mb` of one run, for its end event; None where nothing could be measured (a job
    that ended while the runner was down, a table that reaps nothing)."""
    cpu = cgroup.cpu_s if cgroup is not None and cgroup.cpu_s is not None else None
    if cpu is None and reaped is not None:
        cpu = reaped.cpu_s
    if cgroup is not None and cgroup.peak_kb is not None:
        peak_kb: int | None = cgroup.peak_kb
    else:
        found = max(sampled_kb, reaped.maxrss_kb if reaped is not None else 0)
        peak_kb = found if found or reaped is not None else None
    return {
        "cpu_s": None if cpu is None else round(cpu, 2),
        "peak_rss_mb": None if peak_kb is None else round(peak_kb / 1024, 1),
    }


def run_fields(run: Running) -> dict[str, Any]:
    """What an end event says of the run beyond its outcome: its lane and plan (for `plan status --history`), and
    what it used (runner.accounting: cpu_s, peak_rss_mb; null where it could not be measured)."""
    usage = run.usage if run.usage is not None else end_fields(None, run.peak_kb, None)
    return {"lane": run.lane, "plan": (run.job.plan or "").split("@")[0] or None, **usage}
