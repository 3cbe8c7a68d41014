"""The runner's peak RSS at a queue's size (issue 33), whole processes: a real `python3 -m runner run --tick 10`
(one cpu slot) on a fresh copy of a queue of N no-op jobs with `outputs:` (scale_bench's plan), until the 100th
job after the first has ended and one more tick (a sweep) has passed; then its VmHWM. Min / median / max of
BENCH_RUNS (>= 5) runs, the sizes (and the checkouts, with --baseline DIR) alternated.

The queue is made in the shape `plan push` writes it, without pushing N jobs through the compiler (100 000 take
minutes here): a real push of the same plan with two items, then its first job file and manifest entries
repeated N times, the item's number and the file's sha256 (and the `PLAN=` line's per-job hash) each job's own.

    python3 bench/rss_bench.py [--baseline DIR]      # BENCH_SIZES=10000,100000 BENCH_RUNS=5 BENCH_IDLE_S=10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, machine, peak_rss_mb, plan_cli, run_step, serving, table, wait_end  # noqa: E402
from bench.scale_bench import make_plan  # noqa: E402

RUNS = max(5, int(os.environ.get("BENCH_RUNS", "5")))
AFTER = 100
IDLE_S = float(os.environ.get("BENCH_IDLE_S", "10"))
_PLAN_LINE = re.compile(r"^(# PLAN=[^@\n]*@)[0-9a-f]+$", re.M)


def make_queue(work: Path, jobs: int) -> tuple[Path, Path]:
    """A pushed root of JOBS no-op jobs (see the module's doc) under WORK, and the directory its jobs write to."""
    template = work / "template"
    run_step(plan_cli("push", str(template), str(make_plan(work, 2, "rss"))), PY_ENV)
    first = (template / "queue" / "j-000000.job").read_text()
    written = (template / "manifest.json").read_text()
    manifest = json.loads(written)
    entry, plan = manifest["jobs"]["j-000000.job"], manifest["plan"]
    (output,) = entry["outputs"]
    root = work / "pushed"
    shutil.copytree(template, root)
    shutil.rmtree(root / "queue")
    (root / "queue").mkdir(mode=0o700)
    entries, producers = {}, {}
    for i in range(jobs):
        item = f"{i:06d}"
        text = first.replace("000000", item)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        text = _PLAN_LINE.sub(r"\g<1>" + digest, text)
        data = text.encode()
        name = f"j-{item}.job"
        path = root / "queue" / name
        path.write_bytes(data)
        path.chmod(0o600)
        out = output.replace("000000", item)
        entries[name] = {**entry, "outputs": [out], "sha": hashlib.sha256(data).hexdigest()}
        producers[out] = [name]
    manifest.update(jobs=entries, producers=producers)
    manifest["plans"][plan].update(jobs=entries, producers=producers)
    indent = 1 if written.startswith("{\n") else None  # as the push wrote it (one line since its install work)
    separators = None if indent or '": ' in written[:50] else (",", ":")
    text = json.dumps(manifest, indent=indent, separators=separators, sort_keys=True)
    (root / "manifest.json").write_text(text + "\n")
    return root, Path(output).parent


def one(tree: Path, pushed: Path, work: Path, out: Path) -> float:
    """The peak RSS in MB of TREE's runner serving a fresh copy of PUSHED."""
    with serving(tree, pushed, work, out) as proc:
        wait_end(out, AFTER, proc, str(tree), timeout=1800)
        time.sleep(IDLE_S)  # one more tick: a sweep over every queued job
        return peak_rss_mb(proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. main before) run alternated with this")
    args = parser.parse_args()
    measure([int(s) for s in os.environ.get("BENCH_SIZES", "10000,100000").split(",")], args.baseline)


def measure(sizes: list[int], baseline: Path | None) -> None:
    """The table for SIZES, this checkout's runner (and BASELINE's)."""
    trees = {"this": REPO, **({"baseline": baseline.resolve()} if baseline else {})}
    print(f"machine: {machine()}; {RUNS} runs, alternated\n")
    got: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rss-") as tmp:
        made = {}
        for jobs in sizes:
            work = Path(tmp) / f"n{jobs}"
            work.mkdir()
            started = time.monotonic()
            made[jobs] = (work, *make_queue(work, jobs))
            print(f"queue of {jobs:,} made in {time.monotonic() - started:.1f} s")
        for run in range(RUNS):
            for jobs in sizes:
                work, pushed, out = made[jobs]
                for label, tree in trees.items() if run % 2 == 0 else reversed(trees.items()):
                    got.setdefault((label, jobs), []).append(one(tree, pushed, work, out))
            print(f"run {run + 1} of {RUNS} done ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})")
    rows = []
    for jobs in sizes:
        for label in trees:
            mb = got[(label, jobs)]
            label_ = f"{jobs:,}" + (f" ({label})" if len(trees) > 1 else "")
            rows.append([label_, " / ".join(f"{v:.1f}" for v in (min(mb), statistics.median(mb), max(mb))) + " MB"])
    print(table("the runner's peak RSS (VmHWM) at a queue's size, whole processes", ["queued", "peak RSS"], rows))


if __name__ == "__main__":
    main()
