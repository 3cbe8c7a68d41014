"""What rerunning a job would redo, as the box can tell it: the bytes its outputs hold (for `plan push`).

A marker (a dot-file such as `.ok` or `.done-x`) is measured as its directory, where the plan says no other
job writes there: a download's `.ok` stands for the 52 GB beside it. The walk is bounded, so a huge tree costs
at most MAX_ENTRIES stat() calls and is reported as "at least". Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

MAX_ENTRIES = 20000


def measure(paths: Iterable[str], budget: int = MAX_ENTRIES) -> dict[str, list[int]]:
    """PATH -> [bytes, complete (1) or cut short by the budget (0)] for each path that exists."""
    found: dict[str, list[int]] = {}
    for path in paths:
        if not isinstance(path, str) or not path:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path):
            found[path] = [st.st_size, 1]
            continue
        size, budget, whole = _walk(path, budget)
        found[path] = [size, 1 if whole else 0]
    return found


def _walk(top: str, budget: int) -> tuple[int, int, bool]:
    size = 0
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                if budget <= 0:
                    return size, 0, False
                budget -= 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        size += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return size, budget, True


def format_size(size: int) -> str:
    """52.4 GB, 3.1 MB, 512 B (decimal units, as disks and downloads count)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def stands_for(outputs_by_job: dict[str, list[str]]) -> dict[str, str]:
    """Each output path -> the path to measure for it: a marker's directory where only that job writes there."""
    dirs: dict[str, set[str]] = {}
    for job, outputs in outputs_by_job.items():
        for path in outputs:
            dirs.setdefault(os.path.dirname(path.rstrip("/")), set()).add(job)
    measured = {}
    for job, outputs in outputs_by_job.items():
        for path in outputs:
            parent = os.path.dirname(path.rstrip("/"))
            marker = os.path.basename(path).startswith(".")
            measured[path] = parent if marker and parent and dirs.get(parent) == {job} else path
    return measured
