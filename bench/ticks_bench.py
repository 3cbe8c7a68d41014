"""A job's end at a queue's size (issue 33, the ticks): the same pushed queue of no-op jobs with outputs (one cpu
slot, `--tick 10`) served by this checkout's runner and by a --baseline checkout's, alternated, each on a fresh
copy of one root pushed once per size: the 100 jobs after the first end, per job (the jobs' own clocks), and the
runner's peak RSS (VmHWM) then. Min / median / max of BENCH_RUNS (>= 5) paired runs.

    python3 bench/ticks_bench.py --baseline DIR      # BENCH_SIZES=300,10000 BENCH_RUNS=5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, ended, machine, peak_rss_mb, plan_cli, run_step, serving, spread, table, wait_end  # noqa: E402

RUNS = max(5, int(os.environ.get("BENCH_RUNS", "5")))
AFTER = 100


def make_plan(directory: Path, jobs: int, out: Path) -> Path:
    path = directory / "plan.yaml"
    path.write_text(
        f"""plan: ticks
jobs:
  - name: "j-{{{{ '%06d' % i }}}}"
    foreach: {{i: {{range: [0, {jobs}]}}}}
    lane: cpu
    run: date +%s.%N > {out}/{{{{ '%06d' % i }}}}.txt
    outputs: ["{out}/{{{{ '%06d' % i }}}}.txt"]
"""
    )
    return path


def one(tree: Path, pushed: Path, work: Path, out: Path, jobs: int) -> tuple[float, float]:
    """Per-job seconds of the jobs after the first end, and the runner's peak RSS in MB."""
    after = min(AFTER, jobs - 1)
    with serving(tree, pushed, work, out) as proc:
        last = wait_end(out, after, proc, f"{tree} {jobs}")
        first = ended(out, 0)
        assert first is not None
        return (last - first) / after, peak_rss_mb(proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the checkout to compare with (e.g. main before)")
    args = parser.parse_args()
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "300,10000").split(",")]
    trees = {"this": REPO, "baseline": args.baseline.resolve()}
    print(f"machine: {machine()}; {RUNS} paired runs, alternated\n")
    got: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ticks-") as tmp:
        pushed = {}
        for jobs in sizes:
            work = Path(tmp) / f"n{jobs}"
            work.mkdir()
            out = work / "out"
            out.mkdir()
            run_step(plan_cli("push", str(work / "pushed"), str(make_plan(work, jobs, out))), PY_ENV)
            pushed[jobs] = work
        for run in range(RUNS):
            for jobs in sizes:
                work = pushed[jobs]
                for label, tree in trees.items() if run % 2 == 0 else reversed(trees.items()):
                    per_job, rss = one(tree, work / "pushed", work, work / "out", jobs)
                    got.setdefault((label, jobs, "job"), []).append(per_job)
                    got.setdefault((label, jobs, "rss"), []).append(rss)
            print(f"run {run + 1} of {RUNS} done ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})")
    rows = []
    for jobs in sizes:
        for label in trees:
            per_job, rss = got[(label, jobs, "job")], got[(label, jobs, "rss")]
            mb = " / ".join(f"{v:.1f}" for v in (min(rss), statistics.median(rss), max(rss))) + " MB"
            rows.append([f"{jobs:,} ({label})", spread(per_job), mb])
    print(table("a job's end at a queue's size, whole runner processes", ["queued", "per job", "peak RSS"], rows))
    small, large = sizes[0], sizes[-1]
    for label in trees:
        ratio = statistics.median(got[(label, large, "job")]) / statistics.median(got[(label, small, "job")])
        print(f"{label}: per job at {large:,} / at {small:,}: {ratio:.2f}x (medians)")


if __name__ == "__main__":
    main()
