"""`plan report` over a 1,000,000-line events.jsonl, whole processes: wall time and peak memory (the target:
under 10 s and 200 MB), plain and with --since (which skips by timestamp without building records).

BENCH_RUNS (default 5) runs of each, alternated with a bare interpreter; BENCH_EVENTS sets the size."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY_ENV, machine, plan_cli, spread, table
from bench.gen_events import week_of_events


def write_events(path: Path, count: int) -> int:
    """COUNT generated events (a week of them, scaled) written to PATH, one JSON line each, in chunks."""
    written = 0
    with open(path, "w") as out:
        seed = 7
        while written < count:
            chunk = week_of_events(jobs=200, events=min(200_000, count - written), seed=seed)
            out.write("".join(json.dumps(e) + "\n" for e in chunk[: count - written]))
            written += min(len(chunk), count - written)
            seed += 1
    return written


# The process's own peak (VmHWM): getrusage's ru_maxrss would carry the forking parent's size over the exec.
_PEAK = (
    "import atexit, runpy, sys\n"
    "def peak():\n"
    "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
    "    sys.stderr.write('peak %s\\n' % hwm.split()[1])\n"
    "atexit.register(peak)\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def measure(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one whole process: ARGV is `python3 -m MODULE ARGS...`, run with a line that
    prints the process's own peak RSS as it exits."""
    assert argv[1] == "-m", argv
    start = time.perf_counter()
    proc = subprocess.run(
        [argv[0], "-c", _PEAK, *argv[2:]], env=PY_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    peak = next(int(line.split()[1]) for line in reversed(proc.stderr.splitlines()) if line.startswith("peak "))
    return took, peak / 1024


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    count = int(os.environ.get("BENCH_EVENTS", "1000000"))
    print(f"machine: {machine()}; {runs} runs of each, alternated\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        written = write_events(path, count)
        size_mb = path.stat().st_size / (1 << 20)
        with open(path) as handle:  # line by line: this process stays small, its children are measured
            for number, line in enumerate(handle):
                if number == written // 2:
                    middle = json.loads(line)["ts"]
        last = json.loads(line)["ts"]
        variants = {
            "plan report EVENTS": plan_cli("report", str(path)),
            f"plan report EVENTS --since '{middle}' (the last half)": plan_cli("report", str(path), "--since", middle),
            f"plan report EVENTS --since '{last}' (the last line)": plan_cli("report", str(path), "--since", last),
            "python3 -m this (a bare interpreter)": [sys.executable, "-m", "this"],
        }
        wall: dict[str, list[float]] = {name: [] for name in variants}
        rss: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(runs):
            for name, argv in variants.items():
                took, peak = measure(argv)
                wall[name].append(took)
                rss[name].append(peak)
        rows = [
            [
                name,
                spread(wall[name]),
                " / ".join(f"{v:.0f} MiB" for v in (min(rss[name]), statistics.median(rss[name]), max(rss[name]))),
            ]
            for name in variants
        ]
        print(
            table(
                f"plan report over {written:,} events ({size_mb:.0f} MiB), whole processes",
                ["what", "wall min / median / max", "peak RSS min / median / max"],
                rows,
            )
        )


if __name__ == "__main__":
    main()
