"""An in-process runner driven by `tick(now)` over a fake process table: for what processes are not the point of.

Time is passed in, so a 6-hour threshold takes two ticks; a "process" is a pid in `FakeProcesses`, which a
test ends with `exit(job, rc)` and whose output it writes with `say(job, line)`. Everything else is real:
the queue root, job files, conditions run by bash, events.jsonl, status.json and state.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from runner import procs
from runner.config import Config
from runner.queue import fresh_status
from runner.records import Running
from runner.service import accounting, leaks
from runner.service.gpu import GpuWatch, Holder, Observation
from runner.service.runner import Runner
from tests.conftest import read_events

FAKE_PID_BASE = 4_000_000  # above any pid_max: never a real process


class FakeProcesses:
    """The runner's `Processes`, kept in a dict: spawning records the job, nothing runs."""

    def __init__(self) -> None:
        self.next_pid = FAKE_PID_BASE
        self.jobs: dict[str, int] = {}  # job file -> its latest pid
        self.live: set[int] = set()
        self.exited: dict[int, int] = {}
        self.ended: list[int] = []  # pids the runner ended, in order
        self.gpu: list[procs.GpuUser] = []  # foreign GPU users the runner is shown, as they are
        # Real processes whose GPU use the runner reads (under the roots its config names: a GpuBox's)
        self.gpu_pids: list[int] = []
        self.log_fds: dict[str, Path] = {}
        self.envs: dict[str, dict[str, str]] = {}  # job file -> the environment it was started with

    # what a test does
    def exit(self, job: str, rc: int = 0) -> None:
        pid = self.jobs[job]
        self.live.discard(pid)
        self.exited[pid] = rc

    def running(self) -> list[str]:
        return sorted(job for job, pid in self.jobs.items() if pid in self.live)

    # the Processes protocol
    def adopt_orphans(self) -> None:
        pass

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str, log_fd: int, job: str) -> int:
        self.next_pid += 1
        self.jobs[job] = self.next_pid
        self.envs[job] = dict(env)
        self.live.add(self.next_pid)
        return self.next_pid

    def reap(self) -> None:
        pass

    def exit_code(self, pid: int) -> int | None:
        return self.exited.get(pid)

    def forget(self, pid: int) -> None:
        self.exited.pop(pid, None)

    def usage(self, pid: int) -> accounting.ReapedUsage | None:
        return None  # nothing ran: the end events say cpu_s and peak_rss_mb null

    def tree_rss_kb(self, run: Running) -> int:
        return 0

    def child_waiting(self) -> bool:
        return False

    def tree(self, run: Running) -> list[procs.Proc]:
        if run.pid not in self.live:
            return []
        return [procs.Proc(run.pid, 1, run.pid, "S", "bash", f"bash {run.filename}", run.tag)]

    def end(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid in self.live:
                self.live.discard(pid)
                self.exited[pid] = -15
                self.ended.append(pid)

    def end_cgroup(self, cgroup: str) -> list[int]:
        return []

    def job_cgroup(self, base: str | None, filename: str) -> str | None:
        return None

    def leftovers(self, tag_prefix: str) -> list[procs.Proc]:
        return []

    def job_ended(self, filename: str) -> None:
        pass

    def leaks(self, leaders: set[int]) -> list[leaks.Leak]:
        return []

    def leak_owner(self, pid: int) -> str:
        return "-"

    def alive(self, pid: int) -> bool:
        return pid in self.live

    def gpu_holders(self, watch: GpuWatch, now: float, owner: Callable[[procs.Proc], str | None]) -> Observation:
        table = {pid: found for pid in self.gpu_pids if (found := procs.read_stat(pid)) is not None}
        seen = watch.observe(now, table, owner)
        seen.holders += [Holder(u.pid, u.ppid, u.cmd, "foreign", "", u.devices, True, u.why) for u in self.gpu]
        return seen

    def read_proc(self, pid: int) -> procs.Proc | None:
        return None

    def cgroup_pids(self, cgroup: str) -> list[int]:
        return []


class Ticking:
    """A started runner on ROOT with fake processes; `tick(t)` runs one tick at time T."""

    def __init__(self, root: Path, pid: int | None = None, **config: Any) -> None:
        self.root = root
        self.procs = FakeProcesses()
        config.setdefault("settle_s", 0.0)
        # The sweep's budget is wall time: under load 0.1 s may cut a 300-job pass in two. A test of the spread
        # passes its own budget; every other test judges its whole queue in one sweep, whatever the load.
        config.setdefault("sweep_budget_s", 3600.0)
        self.runner = Runner(Config(root=root, **config), processes=self.procs)
        if pid is not None:  # the process its status.json names (a real one, for `plan watch` to find alive)
            self.runner.pid = pid

    def start(self, now: float) -> Ticking:
        self.runner.start(now)
        return self

    def tick(self, now: float) -> Ticking:
        self.runner.tick(now)
        return self

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.root) if kind is None or e["event"] == kind]

    def status(self) -> dict[str, Any]:
        """status.json with every waiting job (`queued`, from waiting.json), as `plan status --all` reads it."""
        return fresh_status(self.root, json.loads((self.root / "status.json").read_text()), every=True)

    def reason(self, job: str) -> dict[str, Any] | None:
        return next((q for q in self.status()["queued"] if q["job"] == job), None)

    def say(self, job: str, line: str) -> None:
        """JOB writes LINE to its log (the runner watches the log's size)."""
        with open(self.runner.queue.log_path(job), "a") as handle:
            handle.write(line + "\n")

    def close(self) -> None:
        self.runner.queue.close()
        self.runner.release_lock()  # the root's locks, held by start() for the life of a real runner
