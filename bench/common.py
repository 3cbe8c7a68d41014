"""Helpers for the benchmark scripts: alternating A/B timing, medians, ratios, a printed table."""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(runs: int, **variants: Callable[[], object]) -> dict[str, float]:
    """Median seconds of each variant, run A, B, C, A, B, C, ... so that noise hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, fn in variants.items():
            samples[name].append(timed(fn))
    return {name: statistics.median(values) for name, values in samples.items()}


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"## {title}", "", "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines) + "\n"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def machine() -> str:
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})"
