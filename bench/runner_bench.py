"""The runner: tick time at 1 000 and 10 000 queued jobs against the seed's way and the stat() floor; RSS;
start latency of a lane successor and of a newly arrived job. `--latency`: the start latency alone;
BENCH_RUNNER_REPO=DIR: the runner processes run DIR's runner package (to pair this checkout's with another's)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import alternate, machine, ratio, run_step, spread, table  # noqa: E402
from runner.conditions import compile_condition  # noqa: E402
from runner.config import Config  # noqa: E402
from runner.service.runner import Runner  # noqa: E402


def put_job(root: Path, name: str, text: str) -> None:
    """Write a job file as contract 1 asks: to a dot-file, then rename it into queue/ (never read half-written)."""
    tmp = root / "queue" / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, root / "queue" / name)


def make_queue(root: Path, jobs: int) -> list[str]:
    """JOBS gpu jobs in a REQUIRES chain of test -f (each waits for the previous one's output)."""
    (root / "queue").mkdir(parents=True)
    conditions = []
    for i in range(jobs):
        requires = f"test -f {root}/out/{i - 1:05d} && test -s {root}/out/{i:05d}.in"
        done_if = f"test -f {root}/out/{i:05d}"
        put_job(root, f"{i:05d}-gpu-job.job", f"# LANE=gpu\n# REQUIRES={requires}\n# DONE_IF={done_if}\necho {i}\n")
        conditions += [done_if, requires]
    return conditions


def seed_way(conditions: list[str]) -> None:
    """The seed's runner: one `bash -c` per condition per job per tick."""
    for cond in conditions:
        subprocess.run(["bash", "-c", cond], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stat_floor(conditions: list[str]) -> None:
    """One stat() per condition, the least any runner must do."""
    for cond in conditions:
        path = compile_condition(cond).tests[0][1]  # type: ignore[index]
        try:
            os.stat(path)
        except OSError:
            pass


def tick_rows(runs: int) -> tuple[list[list[str]], str]:
    rows = []
    for jobs in (1000, 10000):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            conditions = make_queue(root, jobs)
            # the first tick parses every job file: a fresh runner process each time (it holds the root's lock)
            firsts = [
                float(
                    subprocess.run(
                        [sys.executable, __file__, "--first", str(root)], capture_output=True, text=True, check=True
                    ).stdout
                )
                for _ in range(runs)
            ]
            runner = Runner(Config(root=root, settle_s=0))
            runner.start(time.time())
            runner.tick(time.time())
            compiled = [compile_condition(c) for c in conditions]
            assert all(c.fast for c in compiled)
            # the seed's way is timed on 1 000 conditions and scaled: 20 000 bash forks take half a minute
            sample = conditions[:1000]
            scale = len(conditions) / len(sample)
            result = alternate(
                runs,
                {
                    "tick": lambda r=runner: r.tick(time.time()),
                    "floor": lambda c=conditions: stat_floor(c),
                    "seed": lambda s=sample: seed_way(s),
                },
            )
            seed = [t * scale for t in result["seed"]]
            rows.append(
                [
                    str(jobs),
                    spread(firsts),
                    spread(result["tick"]),
                    spread(result["floor"]),
                    spread(seed) + "*",
                    ratio(result["tick"], result["floor"]),
                    ratio(seed, result["tick"]),
                ]
            )
            runner.queue.close()
    peaks = [
        subprocess.run([sys.executable, __file__, "--rss"], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(3)
    ]
    values = sorted(float(p) for p in peaks)
    rss = f"{values[0]:.1f} / {values[1]:.1f} / {values[2]:.1f} MB (min / median / max of 3 processes, peak resident)"
    return rows, rss


def measure_first(root: Path) -> None:
    """Print the seconds of a fresh runner's first tick over ROOT's queue."""
    runner = Runner(Config(root=root, settle_s=0))  # the files are complete (renamed in)
    runner.start(time.time())
    print(run_step(lambda: runner.tick(time.time())))


def measure_rss() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_queue(root, 10000)
        runner = Runner(Config(root=root, settle_s=0))
        runner.start(time.time())
        for _ in range(3):
            runner.tick(time.time())
        # VmHWM, the peak of this process image: ru_maxrss would carry the parent's peak across exec.
        peak = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
        print(f"{int(peak.split()[1]) / 1024:.1f}")


def _stamp(path: Path) -> str:
    """Shell that writes the time to PATH whole (to a temporary, then renamed): never read half-written."""
    return f"d=$(date +%s.%N); printf '%s\\n' \"$d\" > {path}.tmp && mv {path}.tmp {path}\n"


def _wait_for(path: Path, deadline: float) -> float:
    while not path.exists():
        if time.time() > deadline:
            raise RuntimeError(f"{path} never appeared: is the runner running?")
        time.sleep(0.01)
    return float(path.read_text())


def latency_rows(runs: int) -> list[list[str]]:
    """Real runner processes, --tick 10 as the seed ran: job exit -> successor start; file arrival -> start, for a
    pushed file (its sha256 in manifest.json: no settle wait) and one renamed in by hand (waits --settle, 1 s)."""
    succ, pushed, by_hand = [], [], []
    # BENCH_RUNNER_REPO: run the runner of another checkout (a copy of main's, say) for paired comparisons
    other = os.environ.get("BENCH_RUNNER_REPO", str(REPO))
    env = dict(os.environ, PYTHONPATH=other)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "queue").mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", "10"],
            env=env,
            cwd=other,  # `-m` looks in the working directory first
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(1)
            for i in range(runs):
                deadline = time.time() + 30
                end_a, start_b = root / f"end-a{i}", root / f"start-b{i}"
                put_job(root, f"{i}a-gpu.job", f"# LANE=gpu\nsleep 0.3\n{_stamp(end_a)}")
                put_job(root, f"{i}b-gpu.job", f"# LANE=gpu\n{_stamp(start_b)}")
                succ.append(_wait_for(start_b, deadline) - _wait_for(end_a, deadline))
                for kind, into in (("pushed", pushed), ("by-hand", by_hand)):
                    mark = root / f"arrive-{kind}{i}"
                    name, text = f"{i}c-cpu-{kind}.job", f"# LANE=cpu\n{_stamp(mark)}"
                    if kind == "pushed":  # its hash in manifest.json under the name push writes
                        manifest = {"jobs": {name: {"sha": hashlib.sha256(text.encode()).hexdigest()}}}
                        (root / ".manifest.tmp").write_text(json.dumps(manifest))
                        os.replace(root / ".manifest.tmp", root / "manifest.json")
                    arrived = time.time()
                    put_job(root, name, text)
                    into.append(_wait_for(mark, deadline) - arrived)
        finally:
            proc.terminate()
            proc.wait()
    return [
        [what, spread(values), "up to 10 s (one tick)"]
        for what, values in (
            ("job exit -> lane successor start", succ),
            ("pushed job file arrives -> start", pushed),
            ("job file renamed in by hand -> start (--settle 1s)", by_hand),
        )
    ]


def main() -> None:
    if "--rss" in sys.argv:
        measure_rss()
        return
    if "--first" in sys.argv:
        measure_first(Path(sys.argv[sys.argv.index("--first") + 1]))
        return
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    print(f"machine: {machine()}; {runs} runs of each, alternated\n")
    latency = ("start latency (real runner, --tick 10)", ["what", "min / median / max", "seed"])
    if "--latency" in sys.argv:  # the start latency table alone (seconds, not minutes)
        print(table(*latency, latency_rows(runs)))
        return
    rows, rss = tick_rows(runs)
    print(
        table(
            "runner tick, queued jobs with test -f REQUIRES chains (in-process CPU of one tick)",
            ["queued", "first tick (parse)", "tick", "stat floor", "seed's way", "tick / floor", "seed / tick"],
            rows,
        )
    )
    print(
        "* the seed's way timed on 1 000 conditions and scaled to all of them. Ratios: of medians (range over "
        "paired runs).\n"
    )
    print(f"runner RSS after 3 ticks at 10 000 queued jobs: {rss}\n")
    print(table(*latency, latency_rows(runs)))


if __name__ == "__main__":
    main()
