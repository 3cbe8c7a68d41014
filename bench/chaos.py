"""Kill the runner with -9 at random moments over a 30-job plan, restart it each time, and count what went wrong.

Prints jobs lost, double runs (two runs of one job at once), re-runs of finished jobs (a job started again
after it had ended by itself, done or failed) and leftover processes; all must be 0. Interrupted jobs (ended
by a new runner life) are re-run by design and counted separately. tests/runner/test_chaos.py runs a short form.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Each run appends `start|end|term NAME PID TIME` to runs.log; `end` is the job's last act before it exits.
JOB = """# LANE={lane}
{retries}trap 'echo "term {name} $$ ${{EPOCHREALTIME/,/.}}" >> {log}; exit 143' TERM
echo "start {name} $$ ${{EPOCHREALTIME/,/.}}" >> {log}
sleep {seconds} & wait $!
echo "end {name} $$ ${{EPOCHREALTIME/,/.}}" >> {log}
exit {rc}
"""


@dataclass
class Outcome:
    kills: int = 0
    kills_mid_plan: int = 0  # kills that fell before every job had ended
    jobs: int = 0
    lost: list[str] = field(default_factory=list)
    double_runs: list[str] = field(default_factory=list)
    reruns_of_finished: list[str] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)
    interrupted_reruns: int = 0
    recorded_while_down: int = 0
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)  # for each job above: its runs and its events, as they were

    def ok(self) -> bool:
        return not (self.lost or self.double_runs or self.reruns_of_finished or self.leftovers)


def make_plan(root: Path, jobs: int, rng: random.Random, longest: float) -> dict[str, str]:
    """JOBS job files (renamed into place), each sleeping up to LONGEST seconds; every seventh fails.
    Returns the end state each one must reach."""
    (root / "queue").mkdir(parents=True, exist_ok=True)
    want = {}
    for i in range(jobs):
        lane = ("net", "gpu", "cpu")[i % 3]
        name = f"{i:02d}-{lane}-chaos.job"
        fails = i % 7 == 3
        text = JOB.format(
            lane=lane,
            name=name,
            log=root / "runs.log",
            seconds=f"{rng.uniform(0.05, longest):.2f}",
            rc=3 if fails else 0,
            retries="",
        )
        tmp = root / "queue" / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, root / "queue" / name)
        want[name] = "failed" if fails else "done"
    return want


def _start(root: Path, err: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(err, "ab") as handle:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "run",
                "--root",
                str(root),
                "--tick",
                "0.2",
                "--kill-grace",
                "1",
                "--settle",
                "0",
                "--backoff-base",
                "0.2",
            ],
            env=env,
            stdout=handle,
            stderr=handle,
        )


def _events(root: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _wait_started(root: Path, lives: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(e["event"] == "runner-start" for e in _events(root)) >= lives:
            return
        time.sleep(0.02)
    raise RuntimeError("the runner did not start")


def _tagged(root: Path) -> list[int]:
    """Processes still carrying a tag of this root's runner (see runner.procs)."""
    from runner import procs

    real = str(root.resolve())
    found = []
    for proc in procs.all_procs():
        if proc.tag and proc.state not in ("Z", "X"):
            try:
                cwd = os.readlink(f"/proc/{proc.pid}/cwd")
            except OSError:
                continue
            if cwd == real:
                found.append(proc.pid)
    return found


def run(kills: int, jobs: int = 30, seed: int = 1, root: Path | None = None) -> Outcome:
    rng = random.Random(seed)
    own = root is None
    base = Path(tempfile.mkdtemp(prefix="plan-chaos-")) if own else root
    assert base is not None
    qroot = base / "q"
    # Long enough that the kills (about 0.7 s apart) fall while jobs run: net and gpu share one slot, so about
    # two thirds of the jobs run one after another.
    want = make_plan(qroot, jobs, rng, longest=max(0.5, 2 * kills * 0.7 / (jobs * 2 / 3)))
    err = base / "runner.err"
    started = time.monotonic()
    out = Outcome(jobs=jobs)
    proc = _start(qroot, err)
    lives = 1
    try:
        _wait_started(qroot, lives)
        while out.kills < kills:
            time.sleep(rng.uniform(0.05, 0.6))
            if proc.poll() is not None:
                raise RuntimeError(f"the runner exited by itself ({proc.returncode}); see {err}")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            out.kills += 1
            out.kills_mid_plan += any(
                not ((qroot / "done" / n).exists() or (qroot / "failed" / n).exists()) for n in want
            )
            time.sleep(rng.uniform(0.0, 0.4))  # jobs go on (their own sessions); some end while it is down
            proc = _start(qroot, err)
            lives += 1
            _wait_started(qroot, lives)
        deadline = time.monotonic() + 60 + jobs
        while time.monotonic() < deadline:
            left = [n for n in want if not ((qroot / "done" / n).exists() or (qroot / "failed" / n).exists())]
            if not left:
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    out.seconds = time.monotonic() - started
    time.sleep(0.3)
    out.leftovers = _tagged(qroot)
    for pid in out.leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    _judge(qroot, want, out)
    if own and out.ok():
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return out


def _judge(root: Path, want: dict[str, str], out: Outcome) -> None:
    for name, state in want.items():
        places = [s for s in ("queue", "running", "done", "failed") if (root / s / name).exists()]
        if places != [state]:
            out.lost.append(f"{name}: in {places or 'nowhere'}, want {state}")
    runs: dict[str, dict[str, dict[str, float]]] = {}  # job -> pid -> {kind: time}
    for line in (root / "runs.log").read_text().splitlines():
        kind, name, pid, at = line.split()
        runs.setdefault(name, {}).setdefault(pid, {})[kind] = float(at)
    events = _events(root)
    # The runs a new runner life ended (its orphans-killed event names their pids): interrupted, whether or not
    # the job's TERM trap ran (a TERM that lands while bash runs its last `exit` ends it without the trap).
    ended_by_runner = {str(pid) for e in events if e["event"] == "orphans-killed" for pid in e.get("pids", [])}
    for name, by_pid in runs.items():
        spans = sorted((min(marks.values()), max(marks.values())) for marks in by_pid.values())
        for (_, end_a), (start_b, _) in zip(spans, spans[1:], strict=False):
            if start_b < end_a:
                out.double_runs.append(name)
        # Finished = exited by itself: wrote `end` and was not TERMed (a TERM between its `end` and its exit
        # is the runner ending a job that was still running: an interruption, whatever it had printed).
        interrupted = {pid for pid, marks in by_pid.items() if "term" in marks or pid in ended_by_runner}
        finished = [marks["end"] for pid, marks in by_pid.items() if "end" in marks and pid not in interrupted]
        if finished and any(marks.get("start", 0) > min(finished) for marks in by_pid.values()):
            out.reruns_of_finished.append(name)
        out.interrupted_reruns += len(interrupted)
    out.recorded_while_down = sum(1 for e in events if e.get("while_down"))
    for name in dict.fromkeys([*out.double_runs, *out.reruns_of_finished]):
        said = [f"  run {pid}: {marks}" for pid, marks in runs.get(name, {}).items()]
        said += [f"  event {e}" for e in events if e.get("job") == name or e["event"] == "orphans-killed"]
        out.details.append("\n".join([name, *said]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    out = run(args.kills, args.jobs, args.seed)
    print(f"## runner chaos: kill -9 x{out.kills} over a {out.jobs}-job plan (seed {args.seed}, {out.seconds:.0f} s)\n")
    print("| what | count |\n|---|---|")
    for label, value in (
        ("jobs lost", len(out.lost)),
        ("double runs", len(out.double_runs)),
        ("re-runs of finished jobs", len(out.reruns_of_finished)),
        ("leftover processes", len(out.leftovers)),
        ("kills that fell before the plan had ended", out.kills_mid_plan),
        ("interrupted runs re-run (by design)", out.interrupted_reruns),
        ("ends recorded while the runner was down", out.recorded_while_down),
    ):
        print(f"| {label} | {value} |")
    for detail in out.lost + out.details:
        print(f"  {detail}")
    return 0 if out.ok() else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
