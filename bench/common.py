"""Helpers for the benchmark scripts: whole-process timings, paired and alternated, printed as min/median/max."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A benchmark times the checkout it lives in, whatever `plan` on PATH would import.
PY_ENV = dict(os.environ, PYTHONPATH=str(REPO))

Step = Sequence[str] | Callable[[], object]


def tree_of(env: Mapping[str, str]) -> str:
    """The checkout ENV's PYTHONPATH names, to run `python3 -m` from: it puts the working directory ahead of
    PYTHONPATH on sys.path, so a bench started inside one checkout would otherwise time that one for every tree."""
    return env.get("PYTHONPATH", str(REPO)).split(os.pathsep)[0]


def ended(out: Path, index: int) -> float | None:
    """The end time a no-op job of the queue benches wrote into OUT/INDEX.txt; None while it has not."""
    try:
        text = (out / f"{index:06d}.txt").read_text().strip()
    except OSError:
        return None
    return float(text) if text else None


def wait_end(out: Path, index: int, alive: subprocess.Popen[bytes] | None, what: str, timeout: float = 900) -> float:
    """The end time job INDEX wrote into OUT, once it has; an error if ALIVE (the runner) exits or TIMEOUT passes."""
    deadline = time.monotonic() + timeout
    while (value := ended(out, index)) is None:
        if time.monotonic() > deadline or (alive is not None and alive.poll() is not None):
            raise RuntimeError(f"{what}: job {index} did not end (runner rc {alive and alive.poll()})")
        time.sleep(0.005)
    return value


def peak_rss_mb(pid: int) -> float:
    """PID's peak resident size (VmHWM) in MB."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


@contextmanager
def serving(tree: Path, pushed: Path, work: Path, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """TREE's runner (`--tick 10`) on a fresh copy of the pushed root PUSHED (under WORK), its no-op jobs writing
    into a fresh OUT; terminated, and the copy removed, when the block is left. It starts in TREE: `python3 -m`
    puts the working directory first on sys.path, ahead of PYTHONPATH."""
    root = work / "root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pushed, root, symlinks=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    argv = [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", "10"]
    env = dict(PY_ENV, PYTHONPATH=str(tree))
    proc = subprocess.Popen(argv, env=env, cwd=str(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)  # (a copy of 100,000 jobs)


def run_step(step: Step, env: Mapping[str, str] | None = None) -> float:
    """Seconds one whole process (or a callable that starts processes) took; a failing command is an error."""
    start = time.perf_counter()
    if callable(step):
        step()
    else:
        env = dict(env or PY_ENV)
        proc = subprocess.run(
            list(step), env=env, cwd=tree_of(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
        )
        if proc.returncode not in (0, 1):  # `plan check` exits 1 on findings; anything else is a broken bench
            raise RuntimeError(f"{' '.join(step)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return time.perf_counter() - start


def alternate(
    runs: int,
    variants: Mapping[str, Step],
    env: Mapping[str, str] | None = None,
    before_each: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Every variant's samples, run A, B, C, A, B, C, ... so that the machine's noise hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, step in variants.items():
            if before_each is not None:
                before_each()
            samples[name].append(run_step(step, env))
    return samples


def spread(values: Sequence[float]) -> str:
    """min / median / max, the way every figure in bench/README.md is quoted."""
    return " / ".join(ms(v) for v in (min(values), statistics.median(values), max(values)))


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> str:
    """The ratio of medians, and its range over the paired runs (run i of one against run i of the other)."""
    pairs = sorted(n / d for n, d in zip(numerator, denominator, strict=True))
    return f"{statistics.median(numerator) / statistics.median(denominator):.2f}x ({pairs[0]:.2f}–{pairs[-1]:.2f})"


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        f"## {title}",
        "",
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines) + "\n"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}); "
        f"load average at start {load}"
    )


def plan_cli(*args: str) -> list[str]:
    """argv of the `plan` command of this checkout, as a whole process."""
    return [sys.executable, "-m", "plancompiler.cli", *args]
