"""Push of a 1000-job plan over ssh to a loopback sshd (wall time, ssh connections), and `plan report`
on a generated week of events."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.check_bench import make_plan  # noqa: E402
from bench.common import PY_ENV, alternate, machine, plan_cli, run_step, spread, table  # noqa: E402
from bench.gen_events import week_of_events  # noqa: E402


def push_rows(directory: Path, runs: int) -> list[list[str]]:
    """Each run: a first push to an empty queue, an unchanged re-push, a re-push with one job changed."""
    from tests.sshd import start_sshd, stop_sshd

    server = start_sshd(directory / "sshd")
    # Count ssh connections with a wrapper that logs each start, then runs the real ssh.
    wrapper_dir = directory / "bin"
    wrapper_dir.mkdir()
    count_file = directory / "ssh-count"
    wrapper = wrapper_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\necho x >> {count_file}\nexec /usr/bin/ssh "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    env = dict(PY_ENV, PATH=f"{wrapper_dir}{os.pathsep}{os.environ['PATH']}", PLAN_CACHE_DIR=str(directory / "cache"))
    steps = ("first push", "re-push, unchanged", "re-push, one job changed")
    times: dict[str, list[float]] = {step: [] for step in steps}
    connections: dict[str, set[int]] = {step: set() for step in steps}
    try:
        plan = make_plan(directory / "plan", 1000)
        text = plan.read_text()
        run_step(plan_cli("check", str(plan)), env)  # warm the shellcheck cache: push, not lint, is timed
        for run in range(runs):
            hosts = server.hosts_file(directory / f"remote-q{run}")
            push = plan_cli("push", "testbox", str(plan), "--hosts", str(hosts))
            plan.write_text(text)
            for step in steps:
                if step == "re-push, one job changed":
                    plan.write_text(text.replace("port: 40000}", f"port: {49000 + run}}}", 1))
                    run_step(plan_cli("check", str(plan)), env)
                count_file.write_text("")
                times[step].append(run_step(push, env))
                connections[step].add(len(count_file.read_text().split()))
    finally:
        plan.write_text(text)
        stop_sshd(server)
    return [[step, spread(times[step]), "/".join(map(str, sorted(connections[step])))] for step in steps]


def report_rows(directory: Path, runs: int) -> list[list[str]]:
    events = week_of_events(jobs=200, events=50000)
    path = directory / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    samples = alternate(runs, {"bare": [sys.executable, "-c", "pass"], "report": plan_cli("report", str(path))})
    return [[str(len(events)), "200", spread(samples["report"]), spread(samples["bare"])]]


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    print(f"machine: {machine()}; {runs} runs of each\n")
    with tempfile.TemporaryDirectory() as tmp:
        print(
            table(
                "plan push of a 1000-job plan over ssh (loopback sshd), whole processes",
                ["push", "min / median / max", "ssh connections"],
                push_rows(Path(tmp), runs),
            )
        )
        print(
            table(
                "plan report on a generated week, whole processes",
                ["events", "jobs", "plan report", "python3 -c pass"],
                report_rows(Path(tmp), runs),
            )
        )


if __name__ == "__main__":
    main()
