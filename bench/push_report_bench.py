"""Push of a 1000-job plan over ssh to a loopback sshd (wall time, ssh connections), and `plan report`
on a generated week of events."""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.check_bench import make_plan  # noqa: E402
from bench.common import alternate, machine, ms, table  # noqa: E402
from bench.gen_events import week_of_events  # noqa: E402


def push_rows(directory: Path) -> list[list[str]]:
    from plancompiler.compile import compile_plan
    from plancompiler.hosts import resolve
    from plancompiler.push import PushOptions, push
    from tests.sshd import start_sshd, stop_sshd

    server = start_sshd(directory / "sshd")
    # Count ssh connections with a wrapper that logs each start, then runs the real ssh.
    wrapper_dir = directory / "bin"
    wrapper_dir.mkdir()
    count_file = directory / "ssh-count"
    real_ssh = "/usr/bin/ssh"
    wrapper = wrapper_dir / "ssh"
    wrapper.write_text(f"#!/bin/sh\necho x >> {count_file}\nexec {real_ssh} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    os.environ["PATH"] = f"{wrapper_dir}{os.pathsep}{os.environ['PATH']}"
    rows = []
    try:
        plan_dir = directory / "plan"
        plan = make_plan(plan_dir, 1000)
        os.environ["PLAN_CACHE_DIR"] = str(directory / "cache")
        hosts = server.hosts_file(directory / "remote-q")
        host = resolve("testbox", hosts)

        def push_once() -> tuple[float, int, int]:
            count_file.write_text("")
            started = time.perf_counter()
            compiled = compile_plan(plan)
            outcome = push(compiled, host, PushOptions(verify_external=False), lambda diff: None)
            diff = outcome.diff
            took = time.perf_counter() - started
            sent = len(diff.request.get("files", {}))
            return took, len(count_file.read_text().split()), sent

        compile_plan(plan)  # warm the shellcheck cache: push time, not lint time, is measured here
        for label, change in (("first push", None), ("re-push, unchanged", None),
                              ("re-push, one job changed", ("port: 40000}", "port: 49999}"))):
            if change:
                plan.write_text(plan.read_text().replace(*change, 1))
            took, connections, sent = push_once()
            rows.append([label, ms(took), str(connections), str(sent)])
    finally:
        stop_sshd(server)
    return rows


def report_rows() -> list[list[str]]:
    from plancompiler.report import build_report, read_events

    events = week_of_events(jobs=200, events=50000)
    text = "\n".join(json.dumps(e) for e in events)
    result = alternate(3, report=lambda: build_report(read_events(text)))
    return [[str(len(events)), "200", ms(result["report"])]]


def main() -> None:
    print(f"machine: {machine()}\n")
    with tempfile.TemporaryDirectory() as tmp:
        print(table("plan push of a 1000-job plan over ssh (loopback sshd; plan already checked once)",
                    ["push", "wall time", "ssh connections", "job files sent"], push_rows(Path(tmp))))
    print(table("plan report on a generated week", ["events", "jobs", "time (parse + report)"], report_rows()))


if __name__ == "__main__":
    main()
