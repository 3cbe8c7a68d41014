"""How a queue's size costs (issue 33): at 100 / 1 000 / 10 000 queued jobs (100 000 with --huge), whole
processes, min / median / max of BENCH_RUNS (>= 5) runs; in each run every size is taken in turn (and each checkout,
with --baseline DIR, and task-spooler), so the machine's noise hits all alike:

- push: `plan push ROOT plan.yaml` of a foreach plan of N no-op jobs (`date +%s.%N > out/I.txt`, with `outputs:`)
  to a fresh local root, against writing the same job files and one `sync` (a process of its own); the ratio of
  their wall times, and of their CPU (user + system of each process and its children);
- dispatch: a real `python3 -m runner run --tick 10` (one cpu slot) on that root: the 100 jobs after the first
  end, per job (the jobs' own clocks);
- CPU busy: the runner's CPU seconds (utime + stime from /proc) while it dispatches those 100 jobs, per second of
  them; CPU idle: its CPU seconds over a fixed window of one tick (10 s) with the queue parked (nothing to do);
- status: `plan status ROOT`, its runner alive and parked, its queue still full;
- RSS: the runner's peak RSS (VmHWM) after the idle window;
- check: `plan check plan.yaml --no-cache` (cold);
- task-spooler: `tsp -S 1` with the same N jobs queued behind a blocker (900 for 1 000: it holds ~1 000 at most),
  the 100 after the first end, per job;
- `--only rss`: the runner's peak RSS alone, on queues made in the shape a push writes without pushing each
  job through the compiler (bench/rss_bench.py: 100 000 in seconds rather than minutes).

    python3 bench/scale_bench.py [--huge] [--baseline DIR] [--only dispatch,push,status,check,tsp | --only rss]
    BENCH_RUNS=5 BENCH_SIZES=100,1000,10000 BENCH_IDLE_S=10 BENCH_HUGE_RUNS=5

BENCH_HUGE_RUNS: runs of the 100 000 row (--huge) where 5 of it would not fit the time there is (a push of
100 000 jobs alone takes a minute or more); fewer than 5 is said in its row. Every other size has BENCH_RUNS.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, ended, machine, peak_rss_mb, plan_cli, run_step, spread, table, tree_of, wait_end  # noqa: E402

RUNS = max(5, int(os.environ.get("BENCH_RUNS", "5")))
HUGE = 100000
HUGE_RUNS = max(1, min(RUNS, int(os.environ.get("BENCH_HUGE_RUNS", str(RUNS)))))
AFTER = 100  # the jobs after the first one's end that the dispatch figure times
IDLE_S = float(os.environ.get("BENCH_IDLE_S", "10"))  # the idle window: one --tick
TICK = "10"
FIGURES = ("dispatch", "push", "status", "check", "tsp")
HZ = os.sysconf("SC_CLK_TCK")

# NOTHING_DELETED: every push, write and runner of a run gets directories of their own, and nothing is removed
# until the bench ends (its temporary directory). On an ext4 without a journal (this VM's root file system), a
# file created within a minute of many deletions in its block group (six while their inode table is not yet
# written) costs the kernel a walk over the recently deleted inodes, each looked at in turn (ext4's
# recently_deleted() from find_inode_bit: 55 % of a 10 000-job push's samples in `perf record -g`): when
# the bench removed the previous run's root (10 000 files) just before the push, that push took 4.7-5.0 s (3.9 s
# of it system time) against 1.5 s, and the writer, whose directory went a run earlier, paid nothing of it.

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
    """A foreach plan of JOBS no-op cpu jobs, each writing its end time to its one output (out-LABEL/). Its items
    are listed, names zero-padded (the runner starts them in name order; since 36a7e72 zero-padded numbers share
    one lint shape: a cold check of 10 000 took 31-151 s before it, about 2 s after). A `'%06d' % i` computed in
    the template would still make each job a shape of its own, linted alone."""
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
        # a plan file over `plan`'s 1 MB default (100 000 jobs' items: 2 MB) is checked and pushed with a limit
        # that admits it; the smaller sizes run as before (the limit loads the sandbox's imports)
        big = max(path.stat().st_size for path in self.plans.values()) > 1 << 20
        self.limit = ("--max-size", "16M") if big else ()

    def plan(self, *args: str) -> list[str]:
        """argv of a `plan` command on this size's plan."""
        return plan_cli(*self.limit, *args)

    def fresh(self, label: str, run: int) -> tuple[Path, Path]:
        """A root and an out directory of their own for RUN: none is removed before the bench ends (NOTHING_DELETED).
        The plan's jobs write into out-LABEL, a link turned to RUN's directory (one link replaced, not a directory
        of outputs removed)."""
        root, out = self.dir / f"q-{label}-{run}", self.dir / f"out-{label}-{run}"
        out.mkdir()
        link, turning = self.dir / f"out-{label}", self.dir / f"out-{label}.{run}"
        turning.symlink_to(out.name)
        os.replace(turning, link)
        return root, out


def writer(size: Size, root: Path, run: int) -> float:
    os.sync()  # as before the push: the writer's sync writes only what it wrote
    return run_step([sys.executable, "-c", WRITER, str(root / "queue"), str(size.dir / f"written-{run}")])


def children_cpu() -> float:
    """User + system seconds of this script's ended child processes (and theirs): a push's CPU, less moved by
    the machine's load than its wall time is."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def cpu_s(pid: int) -> float:
    """utime + stime of PID in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def settled(out: Path) -> None:
    """Until OUT gains no file for a second."""
    count, since = -1, time.monotonic()
    while time.monotonic() - since < 1.0:
        now = len(os.listdir(out))
        if now != count:
            count, since = now, time.monotonic()
        time.sleep(0.05)


def runner_run(tree: Tree, size: Size, root: Path, out: Path, add: Callable[[str, float], None]) -> None:
    """Dispatch, CPU busy and idle, status and peak RSS of one runner process on ROOT (pushed, full)."""
    after = min(AFTER, size.jobs - 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", TICK],
        env=tree.env,
        cwd=tree_of(tree.env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_end(out, 0, proc, f"{tree.label} {size.jobs}")
        cpu0, wall0 = cpu_s(proc.pid), time.monotonic()
        wait_end(out, after, proc, f"{tree.label} {size.jobs}")
        cpu1, wall1 = cpu_s(proc.pid), time.monotonic()
        first, last = ended(out, 0), ended(out, after)
        assert first is not None and last is not None
        add("dispatch", (last - first) / after)
        add("busy", (cpu1 - cpu0) / (wall1 - wall0))
        run_step(plan_cli("park", str(root)), tree.env)
        settled(out)  # a job started before the park has ended
        idle0 = cpu_s(proc.pid)
        time.sleep(IDLE_S)
        add("idle", cpu_s(proc.pid) - idle0)
        add("status", run_step(plan_cli("status", str(root)), tree.env))
        add("rss", peak_rss_mb(proc.pid))
    finally:
        proc.terminate()
        proc.wait()


# task-spooler's server serves at most ~1000 clients (TS_MAXCONN), and each queued job is one, a process waiting:
# with 1000 queued (and the blocker) its next `tsp` blocked for good here; -B makes that an error
TSP_MAX = 900


def tsp_run(size: Size) -> float | None:
    """Per-job seconds of the 100 jobs after the first on a task-spooler server (one slot) with N queued behind a
    blocker (TSP_MAX where N is 1 000); None where N is beyond what tsp can hold."""
    jobs = min(size.jobs, TSP_MAX)
    if size.jobs > 1000:
        return None
    after = min(AFTER, jobs - 1)
    out = size.dir / "out-tsp"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    with tempfile.TemporaryDirectory(prefix="tsp-", dir=size.dir) as server:
        env = dict(os.environ, TS_SOCKET=str(Path(server) / "ts.sock"), TMPDIR=server)
        go = Path(server) / "go"
        subprocess.run(["tsp", "-S", "1"], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            blocker = f"while [ ! -e {go} ]; do sleep 0.01; done"
            subprocess.run(["tsp", "-n", "sh", "-c", blocker], env=env, check=True, stdout=subprocess.DEVNULL)
            lines = [f"date +%s.%N > {out}/{i:06d}.txt\n" for i in range(jobs)]
            # the timed jobs one by one in order, the rest after them 8 at a time (each `tsp` a client process)
            for part, parallel in ((lines[: after + 1], "1"), (lines[after + 1 :], "8")):
                feed = subprocess.run(
                    ["xargs", "-d", "\n", "-P", parallel, "-n", "1", "tsp", "-n", "-B", "sh", "-c"],
                    input="".join(part),
                    text=True,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    check=False,
                )
                if feed.returncode:
                    raise RuntimeError(f"queueing {jobs} jobs in tsp failed ({feed.returncode})")
            go.touch()
            wait_end(out, after, None, f"tsp {jobs}")
            first, last = ended(out, 0), ended(out, after)
            assert first is not None and last is not None
            return (last - first) / after
        finally:
            subprocess.run(["tsp", "-K"], env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--huge", action="store_true", help="also 100 000 queued jobs")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. main) run alternated with this one")
    parser.add_argument("--only", default=",".join(FIGURES), help="figures to take (default all)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", "100,1000,10000").split(",")]
    if args.huge and HUGE not in sizes:
        sizes.append(HUGE)
    if only == {"rss"}:
        from bench import rss_bench

        rss_bench.measure(sizes, args.baseline)
        return
    tsp = shutil.which("tsp") if "tsp" in only else None
    if "tsp" in only and tsp is None:
        print("task-spooler (tsp) not found: its column says so (apt-get install task-spooler)\n")
    print(f"machine: {machine()}; {RUNS} runs of each, alternated across sizes, checkouts and tsp\n")
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        base = Path(tmp)
        device = journal_less(base) if only & {"push", "dispatch"} else None
        if device:
            print(
                f"note: {base} is on an ext4 without a journal ({device}): a file created within a minute of many "
                "deletions there (six while their inodes are unwritten) costs the kernel a walk over them; the "
                "push and writer figures hold only where nothing was deleted there in the last minutes\n"
            )
        trees = [Tree("this", REPO, base / "cache-this")]
        if args.baseline:
            trees.append(Tree("baseline", args.baseline.resolve(), base / "cache-base"))
        work = [Size(base, n, [t.label for t in trees]) for n in sizes]
        got: dict[tuple[str, str, int], list[float]] = {}

        for tree in trees:  # warm: the check memo and shellcheck's cache do not favour the first run
            for size in work:
                run_step(size.plan("check", str(size.plans[tree.label])), tree.env)
        for run in range(RUNS):
            for size in work:
                if size.jobs == HUGE and run >= HUGE_RUNS:
                    continue
                for tree in trees:

                    def add(what: str, value: float, tree: Tree = tree, size: Size = size) -> None:
                        got.setdefault((what, tree.label, size.jobs), []).append(value)

                    if "check" in only:
                        add("check", run_step(size.plan("check", str(size.plans[tree.label]), "--no-cache"), tree.env))
                    if not only & {"push", "dispatch", "status"}:
                        continue
                    root, out = size.fresh(tree.label, run)
                    os.sync()  # what the bench wrote before is not left for the push's sync to write
                    before = children_cpu()
                    took = run_step(size.plan("push", str(root), str(size.plans[tree.label])), tree.env)
                    push_cpu = children_cpu() - before
                    if len(os.listdir(root / "queue")) != size.jobs:  # a refused push exits 1, as a check does
                        raise RuntimeError(f"the push of {size.jobs} jobs did not install them all")
                    if "push" in only:
                        add("push", took)
                        add("push cpu", push_cpu)
                        before = children_cpu()
                        add("write+sync", writer(size, root, run))
                        add("write cpu", children_cpu() - before)
                    if only & {"dispatch", "status"}:
                        runner_run(tree, size, root, out, add)
                per_job = tsp_run(size) if tsp else None
                if per_job is not None:
                    got.setdefault(("tsp", "tsp", size.jobs), []).append(per_job)
            print(f"run {run + 1} of {RUNS} done ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})")
            if run + 1 < RUNS:  # the runs so far, where a long run (--huge) is cut short: said as such
                print(f"\n(after {run + 1} runs)")
                print_table(got, trees, sizes, tsp is not None or "tsp" not in only)
    print()
    print_table(got, trees, sizes, tsp is not None or "tsp" not in only)


def journal_less(path: Path) -> str | None:
    """The device of PATH's file system where it is an ext4 without a journal (NOTHING_DELETED), else None."""
    best = ("", "", "")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        mount, (kind, source) = fields[0].split()[4], fields[1].split()[:2]
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best[0]):
            best = (mount, kind, source)
    device = os.path.basename(best[2])
    journals = os.listdir("/proc/fs/jbd2") if os.path.isdir("/proc/fs/jbd2") else []
    has_journal = any(name.startswith(f"{device}-") for name in journals) if device else True
    return device if best[1] == "ext4" and not has_journal else None


def figure(values: list[float] | None, unit: str = "ms") -> str:
    if not values:
        return "—"
    low, mid, high = min(values), statistics.median(values), max(values)
    if unit == "MB":
        return f"{low:.1f} / {mid:.1f} / {high:.1f} MB"
    if unit == "%":
        return f"{100 * low:.0f} / {100 * mid:.0f} / {100 * high:.0f} %"
    return spread(values)


def tsp_figure(values: list[float] | None, size: int, tsp: bool) -> str:
    if not tsp:
        return "tsp not installed"
    if size > 1000:
        return f"cannot queue {size:,} (at most ~1,000: each queued job is a waiting tsp process)"
    return figure(values) + (f" ({TSP_MAX} queued)" if size > TSP_MAX else "")


def push_ratio(pushes: list[float] | None, writes: list[float] | None) -> str:
    """Median push over median write+sync, and the range over the pairs (push i against write i)."""
    if not pushes or not writes:
        return "—"
    pairs = sorted(p / w for p, w in zip(pushes, writes, strict=True))
    return f"{statistics.median(pushes) / statistics.median(writes):.2f}x ({pairs[0]:.2f}–{pairs[-1]:.2f})"


def print_table(got: dict[tuple[str, str, int], list[float]], trees: list[Tree], sizes: list[int], tsp: bool) -> None:
    runner_rows, command_rows = [], []
    for size in sizes:
        for tree in trees:

            def key(what: str, tree: Tree = tree, size: int = size) -> list[float] | None:
                return got.get((what, tree.label, size))

            label = f"{size:,}" + (f" ({tree.label})" if len(trees) > 1 else "")
            if size == HUGE and HUGE_RUNS < RUNS:
                label += f" ({HUGE_RUNS} runs)"
            runner_rows.append(
                [
                    label,
                    figure(key("dispatch")),
                    tsp_figure(got.get(("tsp", "tsp", size)), size, tsp),
                    figure(key("idle")),
                    figure(key("busy"), "%"),
                    figure(key("rss"), "MB"),
                ]
            )
            command_rows.append(
                [
                    label,
                    figure(key("push")),
                    figure(key("write+sync")),
                    push_ratio(key("push"), key("write+sync")),
                    push_ratio(key("push cpu"), key("write cpu")),
                    figure(key("status")),
                    figure(key("check")),
                ]
            )
    print(
        table(
            "the runner against a queue's size, whole processes, min / median / max",
            [
                "queued",
                f"dispatch per job (the {AFTER} after the first; 99 at 100)",
                "task-spooler per job",
                f"runner CPU idle (per {IDLE_S:g} s, parked)",
                "runner CPU busy (of one core, dispatching)",
                "runner peak RSS",
            ],
            runner_rows,
        )
    )
    print(
        table(
            "the commands against a queue's size, whole processes, min / median / max",
            [
                "queued",
                "plan push (local root)",
                "write same files + sync",
                "push vs write+sync",
                "the same, CPU (user + system)",
                "plan status (runner alive, parked)",
                "plan check --no-cache",
            ],
            command_rows,
        )
    )


if __name__ == "__main__":
    main()
