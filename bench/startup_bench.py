"""Start-up of the processes started over and over (by a test run, by `plan` over ssh, by Slurm, by people), whole
processes, this checkout alternated with a baseline checkout (A, B, A, B, ...): wall time and the process's CPU.

    python3 bench/startup_bench.py [--baseline DIR | --ref REF] [--rows WORD,...] [--count]     BENCH_RUNS=7 (>= 5)

--ref REF makes the baseline a `git worktree` of REF (removed at the end); --baseline DIR uses another checkout;
with neither, this checkout alone. Both trees' modules are compiled to bytecode first, so neither pays a compile.
The rows: `runner run --help` (the runner's command line), a runner started on an empty root until its first tick
(status.json written) and then sent SIGTERM, the agent answering one status request on a local root (as `plan`
runs it over ssh: `python3 -S -m runner agent status ROOT`), a push's session (probe, lock, install of one job
file: `python3 -S -m runner agent session ROOT`), one Slurm attempt (`python3 -S -m runner.slurm.attempt BUNDLE 1
0`, as the sbatch wrapper execs it, of a job whose body is `true`, outside Slurm: no squeue on its PATH, so it
takes the body's exit), `plan --version`, `plan status ROOT` (a local root, answered in-process) and `plan check
plans/demo.yaml` (its shellcheck results cached, as after the first check). The agent's status also as the ssh
loader ends (`python3 -S -c LOADER ...` imports runner.agent.dispatch and calls its main; no runpy), less the
loader's own trust check of the copy.
CPU is the process's own user + system time (wait4), which the machine's load disturbs less than the wall time.
--rows keeps the rows whose name holds one of the words. --count runs each row once per checkout and counts
instead of timing: the instructions of its Python process (valgrind's callgrind; a child it starts, such as git,
is not counted; a runner stops itself after exactly one tick, as SIGTERM stops it), and the modules it imports
(`-X importtime`), both deterministic under any load.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY_ENV, REPO, machine, ratio, spread, table

PY = sys.executable
Sample = tuple[float, float]  # (wall s, CPU s)


class How(NamedTuple):
    """How a step starts its Python process: as it is (timed), or under a counter."""

    prefix: tuple[str, ...] = ()  # before the interpreter: valgrind's argv
    flags: tuple[str, ...] = ()  # the interpreter's own: -X importtime
    stderr: Path | None = None  # where its stderr goes (importtime's list); else nowhere


Step = Callable[[Path, Mapping[str, str], How], Sample]


def _start(words: list[str], env: Mapping[str, str], tree: Path, how: How) -> subprocess.Popen[bytes]:
    """WORDS started in TREE as HOW says (its stdin a pipe); the interpreter's argv given HOW's prefix and flags."""
    if words[0] == PY:
        words = [*how.prefix, PY, *how.flags, *words[1:]]
    with open(how.stderr, "ab") if how.stderr else nullcontext(subprocess.DEVNULL) as err:
        return subprocess.Popen(words, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)


def _wait(proc: subprocess.Popen[bytes], started: float, argv: list[str]) -> Sample:
    """PROC's end: (its wall time since STARTED, its user + system CPU)."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1, -signal.SIGTERM):  # `plan check` exits 1 on findings
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def command(*argv: str, stdin: bytes = b"") -> Step:
    """One whole process of ARGV (`{tree}` in a word: the checkout's path), fed STDIN."""

    def step(tree: Path, env: Mapping[str, str], how: How) -> Sample:
        words = [w.replace("{tree}", str(tree)) for w in argv]
        started = time.perf_counter()
        proc = _start(words, env, tree, how)
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        return _wait(proc, started, words)

    return step


def session(work: Path) -> Step:
    """A push's session on a new root under WORK: probe, lock and the install of one job file."""
    count = iter(range(1 << 30))
    lines = [
        {"mode": "probe", "create": True},
        {"mode": "lock", "wait_s": 5, "create": True},
        {"mode": "install", "files": {"a.job": "# LANE=cpu\ntrue\n"}, "create": True},
    ]
    stdin = "".join(json.dumps(line) + "\n" for line in lines).encode()

    def step(tree: Path, env: Mapping[str, str], how: How) -> Sample:
        root = work / f"pushed-{next(count)}"
        return command(PY, "-S", "-m", "runner", "agent", "session", str(root), stdin=stdin)(tree, env, how)

    return step


def attempt(work: Path) -> Step:
    """One Slurm attempt of a job whose body is `true`, from a bundle under WORK, outside Slurm: its PATH has bash
    and no squeue (it cannot ask Slurm, and takes the body's exit), its result written under the bundle's root."""
    from runner.slurm.bundle import Element
    from runner.slurm.wrapper import write_bundle

    bin_ = work / "bin"
    bin_.mkdir(exist_ok=True)
    if not (bin_ / "bash").exists():
        (bin_ / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    bundles: dict[Path, Path] = {}

    def step(tree: Path, env: Mapping[str, str], how: How) -> Sample:
        if tree not in bundles:  # a root of its own for each checkout
            root = work / f"slurm-{len(bundles)}"
            element = Element(
                root=str(root), plan="p", name="a", body=f"{root}/a.sh", log=f"{root}/a.log", text="true\n"
            )
            bundles[tree] = write_bundle(str(root), "p", [element])
        argv = (PY, "-S", "-m", "runner.slurm.attempt", str(bundles[tree]), "1", "0")
        return command(*argv)(tree, {**env, "PATH": str(bin_)}, how)

    return step


# A runner that stops itself once its first tick has ended (where the loop would rest until the next), as SIGTERM
# stops it: under a counter the tick is too slow to time the signal, and the ticks its own moves wake differ.
_ONE_TICK = """import os, signal, sys
from runner.service import loop
rest = loop._wait
def stop(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    rest(*args)
loop._wait = stop
from runner.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def first_tick(work: Path) -> Step:
    """A runner on a new empty root under WORK: started, its first status.json waited for, then SIGTERM."""
    count = iter(range(1 << 30))

    def step(tree: Path, env: Mapping[str, str], how: How) -> Sample:
        root = work / f"root-{next(count)}"
        argv = [PY, "-S", "-m", "runner", "run", "--root", str(root), "--tick", "10"]
        if how.prefix:  # counted: exactly one tick, however slow the counter makes it
            argv[2:4] = ["-c", _ONE_TICK]
        started = time.perf_counter()
        proc = _start(argv, env, tree, how)
        assert proc.stdin is not None
        proc.stdin.close()
        deadline = started + 60 * (10 if how.prefix else 1)
        while not (root / "status.json").exists():
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"{' '.join(argv)}: no first tick (rc {proc.poll()})")
            time.sleep(0.001)
        wall = time.perf_counter() - started
        if not how.prefix:
            proc.send_signal(signal.SIGTERM)
        _, cpu = _wait(proc, started, argv)
        return wall, cpu

    return step


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached `git worktree` of REF in a temporary directory, removed when the block is left."""
    with tempfile.TemporaryDirectory(prefix="startup-base-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), ref], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def _steps(work: Path, root: Path) -> dict[str, Step]:
    """Every row: its name and its step. ROOT: a root a runner has ticked on once."""
    agent = "import sys\nfrom runner.agent.dispatch import main\nsys.exit(main(sys.argv[1:]))"  # the loader's end
    return {
        "python3 -S -c pass": command(PY, "-S", "-c", "pass"),
        "runner run --help": command(PY, "-S", "-m", "runner", "run", "--help"),
        "runner: start to first tick, SIGTERM": first_tick(work),
        "agent status (local root)": command(PY, "-S", "-m", "runner", "agent", "status", str(root), stdin=b"{}"),
        "agent status, as the ssh loader ends": command(PY, "-S", "-c", agent, "status", str(root), stdin=b"{}"),
        "agent session: probe, lock, install": session(work),
        "Slurm attempt (body `true`)": attempt(work),
        "python3 -c pass (site)": command(PY, "-c", "pass"),
        "plan --version": command(PY, "-m", "plancompiler.cli", "--version"),
        "plan status ROOT": command(PY, "-m", "plancompiler.cli", "status", str(root)),
        "plan check plans/demo.yaml": command(PY, "-m", "plancompiler.cli", "check", "{tree}/plans/demo.yaml"),
    }


def measure(trees: dict[str, Path], runs: int, words: list[str], count: bool) -> None:
    print(f"machine: {machine()}; " + ("counted once each" if count else f"{runs} runs of each, alternated") + "\n")
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        work = Path(tmp)
        root = work / "ticked"  # a root a runner has ticked on once: what `plan status` and the agent read
        envs = {}
        for label, tree in trees.items():
            for package in ("runner", "plancompiler"):
                compileall.compile_dir(tree / package, quiet=1)
            envs[label] = dict(PY_ENV, PYTHONPATH=str(tree), PLAN_CACHE_DIR=str(work / f"cache-{label}"))
        this = next(iter(trees))
        first_tick(work)(trees[this], envs[this], How())
        os.replace(next(work.glob("root-*")), root)
        steps = {name: step for name, step in _steps(work, root).items() if not words or any(w in name for w in words)}
        for label, tree in trees.items():  # warm: the check's shellcheck cache, the page cache
            for step in steps.values():
                step(tree, envs[label], How())
        if count:
            _count(trees, envs, steps, work)
            return
        got: dict[tuple[str, str], list[Sample]] = {(name, label): [] for name in steps for label in trees}
        for _ in range(runs):
            for name, step in steps.items():
                for label, tree in trees.items():
                    got[name, label].append(step(tree, envs[label], How()))
    labels = list(trees)
    header = ["command", *(f"{label}: wall" for label in labels), *(f"{label}: CPU" for label in labels)]
    if len(labels) == 2:
        header += ["wall, this / baseline", "CPU, this / baseline"]
    rows = []
    for name in steps:
        walls = [[s[0] for s in got[name, label]] for label in labels]
        cpus = [[s[1] for s in got[name, label]] for label in labels]
        row = [name, *(spread(w) for w in walls), *(spread(c) for c in cpus)]
        if len(labels) == 2:
            row += [ratio(walls[0], walls[1]), ratio(cpus[0], cpus[1]) if min(cpus[1]) > 0 else "-"]
        rows.append(row)
    print(table("start-up, whole processes (min / median / max)", header, rows))
    print(f"median CPU of the rows: {', '.join(f'{lb} {_median_cpu(got, lb):.3f} s' for lb in labels)}")


def _count(trees: dict[str, Path], envs: dict[str, dict[str, str]], steps: dict[str, Step], work: Path) -> None:
    """Each row once per checkout under callgrind (its instructions) and once with -X importtime (its modules)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--count needs valgrind on PATH")
    out, err = work / "callgrind.out", work / "importtime.txt"
    got: dict[tuple[str, str], tuple[int, int]] = {}
    for name, step in steps.items():
        for label, tree in trees.items():
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)
            step(tree, envs[label], How(prefix=(valgrind, "--tool=callgrind", f"--callgrind-out-file={out}")))
            totals = [line for line in out.read_text().splitlines() if line.startswith(("totals:", "summary:"))]
            step(tree, envs[label], How(flags=("-X", "importtime"), stderr=err))
            modules = [line for line in err.read_text().splitlines() if line.startswith("import time:")][1:]
            got[name, label] = int(totals[0].split()[1]), len(modules)
    labels = list(trees)
    header = ["command", *(f"{label}: M instructions" for label in labels), *(f"{label}: modules" for label in labels)]
    if len(labels) == 2:
        header.append("instructions, this / baseline")
    rows = []
    for name in steps:
        counts = [got[name, label] for label in labels]
        row = [name, *(f"{c[0] / 1e6:.1f}" for c in counts), *(str(c[1]) for c in counts)]
        if len(labels) == 2:
            row.append(f"{counts[0][0] / counts[1][0]:.2f}x")
        rows.append(row)
    print(table("start-up, counted: the Python process's instructions and the modules it imports", header, rows))


def _median_cpu(got: dict[tuple[str, str], list[Sample]], label: str) -> float:
    return sum(statistics.median(s[1] for s in samples) for (_, lb), samples in got.items() if lb == label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--baseline", type=Path, help="another checkout, alternated with this one")
    where.add_argument("--ref", help="a commit of this repository, checked out as the baseline (a git worktree)")
    parser.add_argument("--rows", default="", help="comma-separated words: only the rows whose name holds one")
    parser.add_argument("--count", action="store_true", help="count instructions and modules instead of timing")
    args = parser.parse_args()
    runs = max(5, int(os.environ.get("BENCH_RUNS", "7")))
    words = [w for w in args.rows.split(",") if w]
    if args.ref:
        with worktree(args.ref) as base:
            measure({"this": REPO, "baseline": base}, runs, words, args.count)
    else:
        trees = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        measure(trees, runs, words, args.count)


if __name__ == "__main__":
    main()
