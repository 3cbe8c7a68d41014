"""The queued jobs' order as the scanner keeps it in place (a job's end, a new file, a rewrite, a removal, a cancel
change what changed, no re-sort of every queued job) and the dispatcher reads it (priorities and moves merged in
front, never sorted whole): after every change both are what a sort from scratch of the same jobs gives, and the
jobs that start are the first of their lane in that order. In-process runners driven by `tick(now)`."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from runner import jobfile
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_000_000.0


def _job(root: Path, name: str, lane: str = "cpu", priority: int = 0, done_if: str = "") -> None:
    header = f"# LANE={lane}\n" + (f"# PRIORITY={priority}\n" if priority else "")
    header += f"# DONE_IF={done_if}\n" if done_if else ""
    write_job(root, name, header + "true\n")


def _move(root: Path, job: str, to: str, other: str = "") -> None:
    """A `plan move` request, as the agent drops it in control/."""
    body = {"by": "test", "to": to, **({"other": other} if other else {})}
    write_job(root, f"move-{job}", json.dumps(body), state="control")


class Check:
    """Ticks Q and checks, after each tick, the scanner's kept order against one made from scratch."""

    def __init__(self, root: Path, watch: bool) -> None:
        self.root = root
        self.q = Ticking(root).start(T0)
        if watch:  # a scan reads only what the watch says changed, as `serve` runs it
            assert self.q.runner.watch_dirs()
        self.now = T0
        self.started: list[str] = []
        self.lane_of: dict[str, str] = {}  # each job started: its lane then

    def tick(self, sweep: bool = False) -> list[str]:
        """One tick (SWEEP: the timer's; else one a job's end or a new file woke); the jobs it started."""
        before = set(self.q.procs.jobs)
        self.now += 1
        self.q.runner.tick(self.now, sweep=sweep)
        started = sorted(set(self.q.procs.jobs) - before)
        self.started += started
        self._same_as_from_scratch(started)
        return started

    def end_running(self) -> None:
        for job in self.q.procs.running():
            self.q.procs.exit(job, 0)

    def _same_as_from_scratch(self, started: list[str]) -> None:
        runner = self.q.runner
        scanner, moved = runner.scanner, runner.state.priority
        # what the scan took is what queue/ held when it scanned: its files now, and those this tick started
        on_disk = {n for n in os.listdir(self.root / "queue") if n.endswith(".job") and not n.startswith(".")}
        valid = {n for n in on_disk if isinstance(_parse(self.root, n), jobfile.JobFile)}
        assert set(scanner.taken) == valid | set(started)
        taken = {name: parsed.job for name, parsed in scanner.taken.items()}
        assert scanner.queued == sorted(scanner.taken.items())  # name order, the very records the scan took
        assert scanner.lanes == collections.Counter(job.lane for job in taken.values())
        assert scanner.prioritised == sorted((-job.priority, name) for name, job in taken.items() if job.priority)
        order = [name for name, _ in runner.dispatcher.order(scanner.queued)]
        assert order == sorted(taken, key=lambda name: (-moved.get(name, taken[name].priority), name))
        # each job started is the first in that order of its lane's jobs (one slot each, nothing else waits)
        for name in started:
            self.lane_of[name] = taken[name].lane
            assert name == next(n for n in order if taken[n].lane == taken[name].lane), name


def _parse(root: Path, name: str) -> jobfile.JobFile | jobfile.Invalid:
    return jobfile.parse(name, (root / "queue" / name).read_bytes())


@pytest.mark.parametrize("watch", [True, False], ids=["watched", "listed"])
def test_the_kept_order_is_the_order_from_scratch_as_jobs_come_and_go(queue_root: Path, watch: bool) -> None:
    for i in range(10, 40, 2):
        _job(queue_root, f"{i:03d}-j.job", lane=("cpu", "net")[i % 4 == 0], priority=5 if i in (20, 30) else 0)
    c = Check(queue_root, watch)
    assert c.tick(sweep=True) == ["020-j.job", "030-j.job"]  # PRIORITY=5 first in each lane
    c.end_running()
    assert c.tick() == ["010-j.job", "012-j.job"]  # a job's end: the next of each lane, in name order
    # New files sort before, between and after those queued; one of them with a priority below 0.
    _job(queue_root, "000-new.job")
    _job(queue_root, "015-new.job", lane="net", priority=2)
    _job(queue_root, "999-new.job", priority=-1)
    _job(queue_root, "016-new.job", priority=-3)
    c.tick()
    # A queued job's file rewritten (re-parsed): another lane and a priority; another's priority taken away.
    _job(queue_root, "018-j.job", lane="net", priority=7)
    _job(queue_root, "014-j.job", lane="cpu", priority=1)
    c.tick()
    _job(queue_root, "014-j.job", lane="cpu")
    c.tick(sweep=True)
    # One removed by hand, one cancelled (the runner forgets it at once), one made invalid (moved to failed/).
    os.unlink(queue_root / "queue" / "022-j.job")
    write_job(queue_root, "cancel-026-j.job", '{"by": "test"}', state="control")
    write_job(queue_root, "028-j.job", "# LANE=nowhere\ntrue\n")
    c.tick()
    assert not (queue_root / "queue" / "026-j.job").exists() and (queue_root / "failed" / "028-j.job").exists()
    # Moves: first, last, before another; a move on a job whose header has a priority too.
    _move(queue_root, "038-j.job", "first")
    _move(queue_root, "000-new.job", "last")
    _move(queue_root, "034-j.job", "before", "016-new.job")
    _move(queue_root, "015-new.job", "last")
    c.tick()
    assert set(c.q.runner.state.priority) >= {"038-j.job", "000-new.job", "034-j.job", "015-new.job"}
    # A job whose DONE_IF is already true is skipped (the dispatcher forgets it in the middle of its tick).
    _job(queue_root, "017-done.job", done_if="true")
    c.tick(sweep=True)
    assert (queue_root / "done" / "017-done.job").exists()
    # Then every job ends, a tick at each end (one a sweep now and then): the order holds to the last of them.
    for n in range(60):
        c.end_running()
        c.tick(sweep=n % 5 == 4)
        if not c.q.runner.scanner.taken and not c.q.procs.running():
            break
    assert not os.listdir(queue_root / "queue")
    assert c.q.runner.state.priority == {}  # each move ended with its job
    assert c.started.index("038-j.job") < c.started.index("034-j.job")
    last = {c.lane_of[name]: name for name in c.started}
    assert last == {"cpu": "000-new.job", "net": "015-new.job"}  # moved last: behind PRIORITY=-3, -1 and 0
    c.q.close()
