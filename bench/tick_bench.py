"""The runner's tick at 10 000 queued jobs as a whole process, against the stat() floor and the seed's way; its
peak RSS; and how soon a new job file (and a lane's next job) starts, at --tick 10.

Every figure is a real `python3 -m runner run` process: the CPU per tick is its utime+stime (from /proc) over a
window of ticks divided by the ticks it made; the floor and the seed's way are measured in processes of their own,
each window alternated with them (runner, floor, seed, runner, ...). Job files are written to a dot-file and
renamed in (contract 1), so no run ever reads one half-written.

    python3 bench/tick_bench.py            # BENCH_JOBS=10000 BENCH_RUNS=5 BENCH_WINDOW_S=3
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, machine, spread, table  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "10000"))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
WINDOW_S = float(os.environ.get("BENCH_WINDOW_S", "3"))
TICK_S = 0.25  # the runner under test ticks this often, so a window holds a dozen ticks
CLK = os.sysconf("SC_CLK_TCK")
SEED_SAMPLE = 500  # the seed's way forks bash per condition: timed on this many and scaled

# Run in a process of its own: one stat() per PATH, PASSES times; prints the CPU seconds of one pass.
FLOOR = """
import os, sys, time
paths = open(sys.argv[1]).read().split("\\n")
passes = int(sys.argv[2])
start = time.process_time()
for _ in range(passes):
    for path in paths:
        try:
            os.stat(path)
        except OSError:
            pass
print((time.process_time() - start) / passes)
"""
# The seed's runner: one `bash -c` per condition per job per tick; prints the CPU seconds (its own and the
# children's) per condition.
SEED = """
import resource, subprocess, sys
conds = open(sys.argv[1]).read().split("\\n")
for cond in conds:
    subprocess.run(["bash", "-c", cond], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
use = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(sum(u.ru_utime + u.ru_stime for u in use) / len(conds))
"""


def put_job(root: Path, name: str, text: str) -> None:
    tmp = root / "queue" / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, root / "queue" / name)


def make_queue(root: Path, jobs: int) -> tuple[list[str], list[str]]:
    """JOBS cpu jobs in a REQUIRES chain of test -f (each waits for the previous one's output); returns every
    condition and the path each one stat()s."""
    (root / "queue").mkdir(parents=True)
    (root / "out").mkdir()
    conditions, paths = [], []
    for i in range(jobs):
        done_if = f"test -f {root}/out/{i:05d}"
        requires = f"test -f {root}/out/{i - 1:05d}"
        put_job(root, f"{i:05d}-cpu-job.job", f"# LANE=cpu\n# REQUIRES={requires}\n# DONE_IF={done_if}\necho {i}\n")
        conditions += [done_if, requires]
        paths += [f"{root}/out/{i:05d}", f"{root}/out/{i - 1:05d}"]
    return conditions, paths


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime, stime


def ticks(root: Path) -> int:
    return int(json.loads((root / "heartbeat.json").read_text())["tick"])


def peak_rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def runner_window(pid: int, root: Path) -> float:
    """CPU seconds per tick over one window (whole ticks only: it starts and ends right after a tick)."""
    start_tick = ticks(root)
    while ticks(root) == start_tick:
        time.sleep(0.005)
    t0, c0 = ticks(root), cpu_s(pid)
    time.sleep(WINDOW_S)
    t1 = ticks(root)
    while ticks(root) == t1:
        time.sleep(0.005)
    t1, c1 = ticks(root), cpu_s(pid)
    return (c1 - c0) / (t1 - t0)


def run_child(script: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def tick_figures() -> tuple[list[list[str]], str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "q"
        conditions, paths = make_queue(root, JOBS)
        (Path(tmp) / "paths").write_text("\n".join(paths))
        (Path(tmp) / "files").write_text("\n".join(str(p) for p in sorted((root / "queue").iterdir())))
        (Path(tmp) / "seed").write_text("\n".join(conditions[:SEED_SAMPLE]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", str(TICK_S)],
            env=PY_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not (root / "heartbeat.json").exists() or ticks(root) < 3:  # the first tick parses every file
                time.sleep(0.05)
            tick, floor, files, seed = [], [], [], []
            for _ in range(RUNS):  # alternated: runner, floor, per-file floor, seed, runner, ...
                tick.append(runner_window(proc.pid, root))
                floor.append(run_child(FLOOR, str(Path(tmp) / "paths"), "20"))
                files.append(run_child(FLOOR, str(Path(tmp) / "files"), "20"))
                seed.append(run_child(SEED, str(Path(tmp) / "seed")) * len(conditions))
            rss = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
    pairs = lambda num, den: sorted(n / d for n, d in zip(num, den, strict=True))  # noqa: E731
    rows = [
        ["runner tick (CPU)", spread(tick), "1.00x"],
        [
            f"stat floor: one os.stat per condition ({len(conditions)})",
            spread(floor),
            _ratio(tick, floor, pairs(tick, floor)),
        ],
        [f"os.stat of every queued file ({JOBS})", spread(files), _ratio(tick, files, pairs(tick, files))],
        [
            f"seed's way: bash -c per condition (CPU, scaled from {SEED_SAMPLE})",
            spread(seed),
            _ratio(seed, tick, pairs(seed, tick)) + " slower",
        ],
    ]
    return rows, f"{rss:.1f} MB"


def _ratio(num: list[float], den: list[float], pairs: list[float]) -> str:
    return f"{statistics.median(num) / statistics.median(den):.2f}x ({pairs[0]:.2f}–{pairs[-1]:.2f})"


def latency_rows() -> list[list[str]]:
    """A real runner at --tick 10 on an empty queue: a pushed file (its sha256 in manifest.json, as `plan push`
    writes it) renamed into queue/ -> its job's first line; job exit -> the next job of its lane's first line."""
    arrive, succ = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "queue").mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", "10"],
            env=PY_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not (root / "heartbeat.json").exists():
                time.sleep(0.05)
            time.sleep(0.5)
            for i in range(max(RUNS, 5)):
                mark = root / f"arrive{i}"
                name, text = f"{i}c-cpu-new.job", f"# LANE=cpu\ndate +%s.%N > {mark}\n"
                manifest = {"jobs": {name: {"sha": hashlib.sha256(text.encode()).hexdigest()}}}
                (root / ".manifest.tmp").write_text(json.dumps(manifest))
                os.replace(root / ".manifest.tmp", root / "manifest.json")
                time.sleep(0.2)
                arrived = time.time()
                put_job(root, name, text)
                deadline = time.time() + 30
                while time.time() < deadline and not (mark.exists() and mark.read_text().strip()):
                    time.sleep(0.005)
                arrive.append(float(mark.read_text()) - arrived)
                stamps = root / f"stamps{i}"
                put_job(root, f"{i}a-gpu.job", f"# LANE=gpu\nsleep 0.3\ndate +%s.%N >> {stamps}\n")
                put_job(root, f"{i}b-gpu.job", f"# LANE=gpu\ndate +%s.%N >> {stamps}\n")
                while time.time() < deadline and not (stamps.exists() and len(stamps.read_text().split()) == 2):
                    time.sleep(0.02)
                a, b = (float(x) for x in stamps.read_text().split())
                succ.append(b - a)
                time.sleep(0.3)
        finally:
            proc.terminate()
            proc.wait()
    return [
        ["pushed job file renamed into queue/ -> its job runs", spread(arrive), "< 100 ms", "~480 ms (0.5 s poll)"],
        ["job exit -> the lane's next job runs", spread(succ), "< 20 ms", ""],
    ]


def main() -> None:
    print(f"machine: {machine()}; {RUNS} runs of each, alternated\n")
    rows, rss = tick_figures()
    print(
        table(
            f"runner tick at {JOBS} queued jobs (test -f REQUIRES chains), whole processes, CPU per tick",
            ["what", "min / median / max", "runner vs it"],
            rows,
        )
    )
    print(f"runner peak RSS (VmHWM) after {RUNS} windows at {JOBS} queued jobs: {rss} (target < 40 MB)\n")
    print(
        table(
            "pick-up (real runner, --tick 10, empty queue)",
            ["what", "min / median / max", "target", "before"],
            latency_rows(),
        )
    )


if __name__ == "__main__":
    main()
