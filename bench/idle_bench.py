"""The idle runner at a queue's size (issue 33), whole processes: a real `python3 -m runner run --tick 10` (one cpu
slot) on a fresh copy of a queue of N no-op jobs with `outputs:` (made as bench/rss_bench.py makes it), until the
100th job after the first has ended (dispatch: per job, the jobs' own clocks); then `plan park`, and once the jobs
started before it have ended:

- after a park: its CPU (utime + stime) and the bytes it wrote (wchar) over BENCH_PARK_S (30 s: three ticks),
  per 10 s: the sweep gives each waiting job its new reason (`parked`) over a pass, a few thousand a tick;
- parked and settled: a second runner started on the same root (parked), over one 10 s tick from 25 s after its
  first tick (which judged every job): nothing changes, and what it spends is the sweep's budget and fixed costs.

Min / median / max of BENCH_RUNS (>= 5) runs, the sizes and the checkouts (--baseline DIR) alternated.

    python3 bench/idle_bench.py [--baseline DIR] [--settled]   # BENCH_SIZES=10000,100000 BENCH_RUNS=5 BENCH_PARK_S=30
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, machine, plan_cli, run_step, spread, table, wait_end  # noqa: E402
from bench.rss_bench import make_queue  # noqa: E402
from bench.scale_bench import cpu_s, settled  # noqa: E402

RUNS = max(5, int(os.environ.get("BENCH_RUNS", "5")))
PARK_S = float(os.environ.get("BENCH_PARK_S", "30"))
TICK_S = 10.0
AFTER = 100


def written(pid: int) -> int:
    """Bytes PID has written (wchar: every write(), to the page cache or not)."""
    line = next(x for x in Path(f"/proc/{pid}/io").read_text().splitlines() if x.startswith("wchar"))
    return int(line.split()[1])


def window(pid: int, seconds: float) -> tuple[float, float]:
    """PID's CPU seconds and MB written over SECONDS, per TICK_S."""
    cpu0, wrote0 = cpu_s(pid), written(pid)
    time.sleep(seconds)
    scale = TICK_S / seconds
    return (cpu_s(pid) - cpu0) * scale, (written(pid) - wrote0) * scale / 1e6


def megabytes(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in (min(values), statistics.median(values), max(values))) + " MB"


def ticks(root: Path, pid: int) -> int:
    """The ticks of the runner PID by its heartbeat (0 while the heartbeat there is another runner's)."""
    try:
        beat = json.loads((root / "heartbeat.json").read_text())
        return int(beat["tick"]) if beat["pid"] == pid else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def one(tree: Path, pushed: Path, work: Path, out: Path, settled_only: bool = False) -> dict[str, tuple[float, float]]:
    """TREE's runner after a park, and a second one parked and settled, on a fresh copy of PUSHED; SETTLED_ONLY:
    the copy parked before one runner starts, and that runner settled."""
    root = work / "root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pushed, root, symlinks=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    env = dict(PY_ENV, PYTHONPATH=str(tree))
    argv = [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", str(int(TICK_S))]
    found: dict[str, tuple[float, float]] = {}
    if settled_only:
        run_step(plan_cli("park", str(root)), env)
    try:
        for phase in ("settled",) if settled_only else ("park", "settled"):
            proc = subprocess.Popen(argv, env=env, cwd=str(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if phase == "park":
                    first = wait_end(out, 0, proc, str(tree), timeout=1800)
                    found["dispatch"] = ((wait_end(out, AFTER, proc, str(tree), timeout=1800) - first) / AFTER, 0.0)
                    run_step(plan_cli("park", str(root)), env)
                    settled(out)
                    found[phase] = window(proc.pid, PARK_S)
                else:
                    deadline = time.monotonic() + 600
                    while ticks(root, proc.pid) < 1:  # its first tick judges every job
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"{tree}: the parked runner did not tick (rc {proc.poll()})")
                        time.sleep(0.1)
                    time.sleep(2.5 * TICK_S)  # and two sweeps more
                    found[phase] = window(proc.pid, TICK_S)
            finally:
                proc.terminate()
                proc.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. main before) run alternated with this")
    parser.add_argument("--settled", action="store_true", help="parked and settled only (a runner on a parked copy)")
    args = parser.parse_args()
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "10000,100000").split(",")]
    trees = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    print(f"machine: {machine()}; {RUNS} runs, alternated\n")
    got: dict[tuple[str, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="idle-") as tmp:
        made = {}
        for jobs in sizes:
            work = Path(tmp) / f"n{jobs}"
            work.mkdir()
            made[jobs] = (work, *make_queue(work, jobs))
        for run in range(RUNS):
            for jobs in sizes:
                work, pushed, out = made[jobs]
                for label, tree in trees.items() if run % 2 == 0 else reversed(trees.items()):
                    for phase, (cpu, mb) in one(tree, pushed, work, out, args.settled).items():
                        got.setdefault((f"{phase} cpu", label, jobs), []).append(cpu)
                        got.setdefault((f"{phase} mb", label, jobs), []).append(mb)
            print(f"run {run + 1} of {RUNS} done ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})")
    rows = []
    for jobs in sizes:
        for label in trees:
            name = f"{jobs:,}" + (f" ({label})" if len(trees) > 1 else "")
            rows.append([name])
            for what in ("park cpu", "park mb", "settled cpu", "settled mb", "dispatch cpu"):
                values = got.get((what, label, jobs))
                rows[-1].append("—" if not values else megabytes(values) if what.endswith("mb") else spread(values))
    head = ["queued", "CPU after a park", "written after a park", "CPU parked and settled", "written settled"]
    head.append(f"dispatch per job (the {AFTER} after the first)")
    print(table(f"the idle runner per {TICK_S:g} s tick, whole processes, min / median / max", head, rows))


if __name__ == "__main__":
    main()
