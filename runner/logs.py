"""Job logs: tails, last lines, failure signatures for correlated-failure, closest names for missing outputs."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

_TAIL_BYTES = 16384
TAIL_LINES = 5  # the last lines of a failed job's log that its event carries (runner.config's tail_lines)


@functools.lru_cache(maxsize=None)
def _masks() -> tuple[tuple[re.Pattern[str], str], ...]:
    """Compiled at the first failure signed (~1 M instructions a start that signs none: every runner's, and
    every Slurm attempt's)."""
    return (
        (re.compile(r"(?:/[\w.@+-]+)+/?"), "<path>"),
        (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
        (re.compile(r"\b[0-9a-fA-F]{7,}\b"), "<hex>"),
        (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    )


def tail_lines(path: Path, n: int, start: int = 0) -> list[str]:
    """The last N non-empty lines of PATH after byte START; curl's \\r updates count as lines."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = max(start, size - _TAIL_BYTES)
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return []
    return lines_of(data.decode("utf-8", errors="replace"))[-n:]


def lines_of(text: str) -> list[str]:
    """A log's TEXT as the job's own non-empty lines: curl's \\r updates count as lines, the runner's `=== `
    headers do not."""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text)]
    return [ln for ln in lines if ln and not ln.startswith("=== ")]


def last_start(path: Path) -> int:
    """The byte offset just after the last `=== ... start` header the runner wrote into a job's log."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            offset = max(0, size - _TAIL_BYTES)
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return 0
    at = data.rfind(b"\n=== ") + 1  # 0 when the header is the first line, or there is none
    if at == 0 and not data.startswith(b"=== "):
        return 0
    end = data.find(b"\n", at)
    return offset + (end + 1 if end >= 0 else len(data))


def last_line(path: Path) -> str:
    lines = tail_lines(path, 1)
    return lines[0][:300] if lines else ""


def signature(line: str, job: str) -> str:
    """LINE with what differs between jobs masked: the job's own name, paths, hex ids, numbers."""
    text = line
    stem = job[:-4] if job.endswith(".job") else job
    for part in sorted({stem, *stem.split("-")}, key=len, reverse=True):
        if len(part) >= 3:
            text = text.replace(part, "<job>")
    for pattern, mask in _masks():
        text = pattern.sub(mask, text)
    return " ".join(text.split())


def meaningful(lines: list[str]) -> list[str]:
    """Lines that carry a message: not bare punctuation or a progress bar."""
    return [ln for ln in lines if re.search(r"[A-Za-z]{3,}", ln)]


def closest_names(path: str, limit: int = 3) -> list[str]:
    """Existing files next to a missing PATH whose names are closest to it (the 84b typo)."""
    directory, name = os.path.split(path)
    try:
        siblings = os.listdir(directory or ".")
    except OSError:
        return []
    import difflib  # only when an output is missing (imported by every Slurm wrapper)

    matches = difflib.get_close_matches(name, siblings, n=limit, cutoff=0.5)
    return [os.path.join(directory, m) for m in matches]
