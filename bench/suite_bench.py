"""The whole test suite as CI runs it (`CI=true python3 -m pytest -q`, xdist's `-n auto`), this checkout alternated
with a baseline checkout: wall time and the CPU of everything the run waited for.

    python3 bench/suite_bench.py [--baseline DIR] [-- PYTEST ARGS...]     BENCH_RUNS=5 (at least 3)

The suite is CPU-bound on 2 cores (both busy from its second second to its last few), so its wall time follows
its CPU; the CPU is the figure the machine's load disturbs least, and the one to compare while other work shares
the cores. CPU is user + system time of the pytest process and every process it waited for (wait4's rusage: the
xdist workers, the runners, shells, shellchecks, the sshd and Slurm daemons each worker started and stopped);
processes that detached and were reaped by init are not in it (Slurm's job steps, the daemons slurmctld and
slurmd fork off), a few seconds of a run. Each pair is run in both orders in turn (A B, B A, ...), so that
neither always runs in the other's wake. A run whose suite did not pass is shown with its last line, and its
figures are kept out of the table: a failure cut short measures nothing.

For where the CPU goes (by command, across every process), BSD process accounting, as root and when no other
accounting file is on: `touch F && accton F`, run the suite, `accton off`, `sa -a -c F` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, machine, ratio, spread, table

Sample = tuple[float, float, float, float]  # wall, CPU, user, system (s)


def run_suite(tree: Path, args: list[str]) -> tuple[Sample | None, str]:
    """One whole suite of TREE: its figures, or None if it did not pass; and pytest's last line, after the
    tests that failed."""
    env = dict(os.environ, CI="true", PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = proc.stdout.read() if proc.stdout else b""  # the run's own output, read to its end (never a full pipe)
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        # Interrupted (Ctrl-C, or SIGTERM): the suite is stopped as Ctrl-C stops it, so that its workers tear their
        # fixtures down (the sshd and Slurm daemons they started) instead of running on without this bench.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = out.decode(errors="replace").splitlines()
    last = next((line for line in reversed(lines) if line.strip()), "")
    if proc.returncode != 0:
        failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        return None, "; ".join([*failed, last])
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_utime, usage.ru_stime), last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout, alternated with this one")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM stops the suite as Ctrl-C does
    # Started as a shell's background job, this process has SIGINT ignored, and so would every process of the
    # suite (a handled signal is reset to the default in a child; an ignored one stays ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    if runs < 3:
        parser.error("BENCH_RUNS: at least 3")
    trees = {"this": REPO}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    print(f"machine: {machine()}; {runs} runs of each, alternated")
    samples: dict[str, list[Sample]] = {name: [] for name in trees}
    for index in range(runs):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for name in order:
            sample, last = run_suite(trees[name], args.pytest_args)
            shown = "FAILED, left out" if sample is None else f"wall {sample[0]:.1f} s, CPU {sample[1]:.1f} s"
            print(f"run {index + 1} {name}: {shown} ({last.strip('= ')})", flush=True)
            if sample is not None:
                samples[name].append(sample)
    rows = []
    for name, values in samples.items():
        if values:
            columns = [[v[i] for v in values] for i in range(4)]
            rows.append([name, str(len(values)), *(spread(c) for c in columns)])
    print()
    print(table("The suite (CI=true, -n auto)", ["tree", "runs", "wall", "CPU", "user", "system"], rows))
    this, base = samples["this"], samples.get("baseline", [])
    if base and len(this) == len(base):
        print(f"this / baseline: wall {ratio([s[0] for s in this], [s[0] for s in base])}, ", end="")
        print(f"CPU {ratio([s[1] for s in this], [s[1] for s in base])}")
    return 0 if all(len(v) == runs for v in samples.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
