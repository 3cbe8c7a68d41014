"""How a queue's size costs (issue 33): at 100 / 1 000 / 10 000 queued jobs (100 000 with --huge), whole
processes, min / median / max of BENCH_RUNS (>= 5) runs, each figure alternated across the sizes (and against
a baseline checkout with --baseline DIR) so the machine's noise hits all alike:

- dispatch: a real `python3 -m runner run --tick 10` (one cpu slot) on a foreach plan of no-op jobs
  (`date +%s.%N > out/I.txt`, with `outputs:`): the 100 jobs after the first end, per job (the jobs' own clocks);
- push: `plan push ROOT plan.yaml` to a fresh local root, against writing the same job files and one `sync`;
- status: `plan status ROOT` with that root's runner alive (parked after the dispatch run, its queue still full);
- RSS: the runner's peak RSS (VmHWM) at the end of the dispatch run;
- check: `plan check plan.yaml --no-cache` (cold).

    python3 bench/scale_bench.py [--huge] [--baseline DIR] [--only dispatch,push,status,check]
    BENCH_RUNS=5 BENCH_SIZES=100,1000,10000
"""

from __future__ import annotations

import argparse
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

from bench.common import PY_ENV, machine, plan_cli, run_step, spread, table  # noqa: E402

RUNS = max(5, int(os.environ.get("BENCH_RUNS", "5")))
AFTER = 100  # the jobs after the first one's end that the dispatch figure times
FIGURES = ("dispatch", "push", "status", "check")

# Writes the same job files a push installs (names and bytes taken from a pushed queue/) into a fresh
# directory, then one sync: the floor a push is held against.
WRITER = """
import os, sys
src, dst = sys.argv[1], sys.argv[2]
files = [(n, open(os.path.join(src, n), "rb").read()) for n in sorted(os.listdir(src))]
os.makedirs(dst)
for name, data in files:
    with open(os.path.join(dst, name), "wb") as handle:
        handle.write(data)
os.sync()
"""


def make_plan(directory: Path, jobs: int, label: str) -> Path:
    """A foreach plan of JOBS no-op cpu jobs, each writing its end time to its one output (out-LABEL/)."""
    out = directory / f"out-{label}"
    items = "\n".join(f"    - {{i: '{i:06d}'}}" for i in range(jobs))
    text = f"""plan: scale
vars:
  items:
{items}
jobs:
  - name: "j-{{{{ i }}}}"
    foreach: items
    lane: cpu
    run: date +%s.%N > {out}/{{{{ i }}}}.txt
    outputs: ["{out}/{{{{ i }}}}.txt"]
"""
    path = directory / f"plan-{label}.yaml"
    path.write_text(text)
    return path


class Tree:
    """One checkout under test: its environment for `plan` and the runner."""

    def __init__(self, label: str, path: Path, cache: Path) -> None:
        self.label = label
        self.env = dict(PY_ENV, PYTHONPATH=str(path), PLAN_CACHE_DIR=str(cache))


class Size:
    def __init__(self, base: Path, jobs: int, labels: list[str]) -> None:
        self.jobs = jobs
        self.dir = base / f"n{jobs}"
        self.dir.mkdir()
        # a plan (and out dir) per checkout: one's parked runner never sees the other's outputs appear
        self.plans = {label: make_plan(self.dir, jobs, label) for label in labels}
        self.kept: list[subprocess.Popen[bytes]] = []  # parked runners whose roots the status figure reads
        self.roots: dict[str, Path] = {}

    def fresh(self, label: str, run: int) -> Path:
        root = self.dir / f"q-{label}-{run}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(self.dir / f"out-{label}", ignore_errors=True)
        (self.dir / f"out-{label}").mkdir()
        return root


def push(tree: Tree, size: Size, root: Path) -> float:
    return run_step(plan_cli("push", str(root), str(size.plans[tree.label])), tree.env)


def writer(size: Size, root: Path) -> float:
    target = size.dir / "written"
    shutil.rmtree(target, ignore_errors=True)
    took = run_step([sys.executable, "-c", WRITER, str(root / "queue"), str(target)])
    shutil.rmtree(target, ignore_errors=True)
    return took


def peak_rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def ended(out: Path, index: int) -> float | None:
    try:
        text = (out / f"{index:06d}.txt").read_text().strip()
    except OSError:
        return None
    return float(text) if text else None


def dispatch(tree: Tree, size: Size, root: Path, keep: bool) -> tuple[float, float]:
    """Per-job seconds of the AFTER jobs after the first end (all of them where fewer are queued), and the
    runner's peak RSS in MB."""
    after = min(AFTER, size.jobs - 1)
    out = size.dir / f"out-{tree.label}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", "10"],
        env=tree.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while ended(out, after) is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{tree.label} {size.jobs}: job {after} did not end (runner rc {proc.poll()})")
            time.sleep(0.02)
        first, last = ended(out, 0), ended(out, after)
        assert first is not None and last is not None
        rss = peak_rss_mb(proc.pid)
        if keep:  # parked and alive, its queue full: what `plan status` reads
            run_step(plan_cli("park", str(root)), tree.env)
            size.kept.append(proc)
            size.roots[tree.label] = root
        return (last - first) / after, rss
    finally:
        if not keep:
            proc.terminate()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--huge", action="store_true", help="also 100 000 queued jobs")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. main) run alternated with this one")
    parser.add_argument("--only", default=",".join(FIGURES), help="figures to take (default all)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "100,1000,10000").split(",")]
    if args.huge:
        sizes.append(100000)
    print(f"machine: {machine()}; {RUNS} runs of each, alternated across sizes and checkouts\n")
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        base = Path(tmp)
        trees = [Tree("this", REPO, base / "cache-this")]
        if args.baseline:
            trees.append(Tree("baseline", args.baseline.resolve(), base / "cache-base"))
        work = [Size(base, n, [t.label for t in trees]) for n in sizes]
        got: dict[tuple[str, str, int], list[float]] = {}

        def add(what: str, tree: Tree, size: Size, value: float) -> None:
            got.setdefault((what, tree.label, size.jobs), []).append(value)

        try:
            for tree in trees:  # warm: the check memo and shellcheck's cache do not favour the first run
                for size in work:
                    run_step(plan_cli("check", str(size.plans[tree.label])), tree.env)
            for run in range(RUNS):
                for size in work:
                    for tree in trees:
                        if "check" in only:
                            check = plan_cli("check", str(size.plans[tree.label]), "--no-cache")
                            add("check", tree, size, run_step(check, tree.env))
                        if not only & {"push", "dispatch", "status"}:
                            continue
                        root = size.fresh(tree.label, run)
                        took = push(tree, size, root)
                        if "push" in only:
                            add("push", tree, size, took)
                            add("write+sync", tree, size, writer(size, root))
                        if only & {"dispatch", "status"}:
                            keep = run == RUNS - 1 and "status" in only
                            if "dispatch" in only or keep:
                                per_job, rss = dispatch(tree, size, root, keep)
                                add("dispatch", tree, size, per_job)
                                add("rss", tree, size, rss)
                        if run != RUNS - 1:
                            shutil.rmtree(root, ignore_errors=True)
            if "status" in only:
                for _ in range(RUNS):
                    for size in work:
                        for tree in trees:
                            root = size.roots[tree.label]
                            add("status", tree, size, run_step(plan_cli("status", str(root)), tree.env))
        finally:
            for size in work:
                for proc in size.kept:
                    proc.terminate()
                    proc.wait()
    print_table(got, trees, sizes)


def figure(values: list[float] | None, unit: str = "ms") -> str:
    if not values:
        return "—"
    if unit == "MB":
        return " / ".join(f"{v:.1f}" for v in (min(values), statistics.median(values), max(values))) + " MB"
    return spread(values)


def push_ratio(pushes: list[float] | None, writes: list[float] | None) -> str:
    """Median push over median write+sync, and the range over the pairs (push i against write i)."""
    if not pushes or not writes:
        return "—"
    pairs = sorted(p / w for p, w in zip(pushes, writes, strict=True))
    return f"{statistics.median(pushes) / statistics.median(writes):.2f}x ({pairs[0]:.2f}–{pairs[-1]:.2f})"


def print_table(got: dict[tuple[str, str, int], list[float]], trees: list[Tree], sizes: list[int]) -> None:
    rows = []
    for size in sizes:
        for tree in trees:
            key = lambda what: got.get((what, tree.label, size))  # noqa: E731, B023
            label = f"{size:,}" + (f" ({tree.label})" if len(trees) > 1 else "")
            rows.append(
                [
                    label,
                    figure(key("dispatch")),
                    figure(key("push")),
                    figure(key("write+sync")),
                    push_ratio(key("push"), key("write+sync")),
                    figure(key("status")),
                    figure(key("rss"), "MB"),
                    figure(key("check")),
                ]
            )
    print(
        table(
            "a queue's size against its costs, whole processes, min / median / max",
            [
                "queued",
                f"per job, the {AFTER} after the first end (99 at 100)",
                "plan push (local root)",
                "write same files + sync",
                "push vs write+sync",
                "plan status (runner alive, parked)",
                "runner peak RSS",
                "plan check --no-cache",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
