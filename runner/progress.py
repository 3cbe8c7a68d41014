"""Download progress from a log tail: curl's and wget's progress lines, tqdm bars, or `PROGRESS: n/total` (stdlib)."""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple[re.Pattern[str], ...]:
    """(own, curl, tqdm, wget's bar, wget's dots), compiled at the first progress read (~5 M instructions): a
    runner's start, or an agent's, that reads no running job's progress never pays for them."""
    curl = (
        r"^\s*(\d{1,3})\s+(\S+)\s+(\d{1,3})\s+(\S+)\s+\d{1,3}\s+\S+\s+(\S+)\s+\S+\s+"
        r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$"
    )
    return (
        re.compile(r"PROGRESS:\s*([\d.]+)\s*/\s*([\d.]+)\s*(.*)$"),
        re.compile(curl),
        re.compile(r"(\d{1,3})%\|[^|]*\|\s*([\d.]+\s*\w*)/([\d.]+\s*\w*)\s*\[([\d:]+)<([\d:?]+),\s*([^\]]+)\]"),
        re.compile(r"(\d{1,3})%\[[^\]]*\]\s+(\S+)\s+(\S+/s)\s+(?:eta|in)\s+(.+?)\s*$"),
        re.compile(r"^\s*\d+K[ .]+\s+(\d{1,3})%\s+(\S+)\s+(\S+)\s*$"),
    )


def parse_progress(tail: str) -> str | None:
    """The newest progress the log shows, as 'P% of TOTAL at RATE, ETA T', or None."""
    for line in reversed([ln for ln in re.split(r"[\r\n]+", tail) if ln.strip()]):
        found = parse_line(line)
        if found:
            return found
    return None


def parse_line(line: str) -> str | None:
    own, curl, tqdm, wget_bar, wget_dot = _patterns()
    m = own.search(line)
    if m:
        done, total = float(m.group(1)), float(m.group(2))
        pct = 100 * done / total if total else 0
        unit = f" {m.group(3).strip()}" if m.group(3).strip() else ""
        return f"{pct:.0f}% ({m.group(1)}/{m.group(2)}{unit})"
    m = curl.match(line)
    if m and m.group(7) != "--:--:--":
        pct_text, total_text, received, rate, left = m.group(3), m.group(2), m.group(4), m.group(5), m.group(8)
        return f"{pct_text}% of {total_text} ({received}) at {rate}/s, ETA {left}"
    m = tqdm.search(line)
    if m:
        return f"{m.group(1)}% of {m.group(3)} ({m.group(2)}) at {m.group(6).strip()}, ETA {m.group(5)}"
    m = wget_bar.search(line)
    if m:
        return f"{m.group(1)}% ({m.group(2)}) at {m.group(3)}, ETA {m.group(4)}"
    m = wget_dot.match(line)
    if m:
        return f"{m.group(1)}% at {m.group(2)}/s, ETA {m.group(3)}"
    return None
