"""The runner's one door to the operating system's processes: spawn, reap, find a job's tree, end, GPU users.

`Processes` is the protocol the runner is written against; `OsProcesses` is the real one (/proc, signals,
cgroups, the subreaper). Tests where processes are not the point pass a fake table instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from runner import cgroups, procs
from runner.records import Running
from runner.service import accounting, leaks

if TYPE_CHECKING:
    from runner.service.gpu import GpuWatch, Observation


class Processes(Protocol):
    def adopt_orphans(self) -> None: ...
    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str, log_fd: int, job: str) -> int: ...
    def reap(self) -> None: ...
    def exit_code(self, pid: int) -> int | None: ...
    def usage(self, pid: int) -> accounting.ReapedUsage | None: ...
    def tree_rss_kb(self, run: Running) -> int: ...
    def forget(self, pid: int) -> None: ...
    def child_waiting(self) -> bool: ...
    def tree(self, run: Running) -> list[procs.Proc]: ...
    def end(self, pids: Iterable[int]) -> None: ...
    def end_cgroup(self, cgroup: str) -> list[int]: ...
    def job_cgroup(self, base: str | None, filename: str) -> str | None: ...
    def leftovers(self, tag_prefix: str) -> list[procs.Proc]: ...
    def job_ended(self, filename: str) -> None: ...
    def leaks(self, leaders: set[int]) -> list[leaks.Leak]: ...
    def leak_owner(self, pid: int) -> str: ...
    def alive(self, pid: int) -> bool: ...
    def gpu_holders(self, watch: GpuWatch, now: float, owner: Callable[[procs.Proc], str | None]) -> Observation: ...
    def read_proc(self, pid: int) -> procs.Proc | None: ...
    def cgroup_pids(self, cgroup: str) -> list[int]: ...


class OsProcesses:
    """The real table. It reaps every child (the runner is a subreaper), keeping the codes of jobs it spawned."""

    def __init__(self, kill_grace_s: float) -> None:
        self.kill_grace_s = kill_grace_s
        self._ours: set[int] = set()
        self._exited: dict[int, int] = {}  # pid -> exit code, reaped but not yet handled
        self._usage: dict[int, accounting.ReapedUsage] = {}  # pid -> what its tree used, reaped but not yet handled
        self._lifetimes: list[leaks.Lifetime] = []  # jobs' start..end in clock ticks, to name a leak's job
        # Every process's /proc/PID/stat, read once between reaps: a job's end looks at its tree, the leaks and
        # (before its lane's next job starts) the GPU users, and each of them would read all of /proc again.
        self._stats: dict[int, procs.Stat] | None = None
        # Our descendants' alone, where that is all a job's end needs to read: every process a job started is
        # one of them while we are the subreaper (an orphan comes back to us, not to PID 1).
        self._mine: dict[int, procs.Stat] | None = None
        self._walk = False  # True once we are the subreaper and the kernel lists each task's children

    def stats(self) -> dict[int, procs.Stat]:
        if self._stats is None:
            self._stats = procs.all_stats()
        return self._stats

    def mine(self) -> dict[int, procs.Stat]:
        """pid -> stat of each of this runner's descendants, read once between reaps (from the whole table where
        that was read, or where they cannot be found from us down)."""
        if self._mine is None:
            if self._walk and self._stats is None:
                self._mine = procs.descendant_stats(os.getpid())
            else:
                table = self.stats()
                self._mine = {pid: table[pid] for pid in procs.descendants(table, os.getpid())}
        return self._mine

    def _forget_reads(self) -> None:
        self._stats = None
        self._mine = None

    def adopt_orphans(self) -> None:
        self._walk = procs.set_child_subreaper() and procs.children_files()

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: str, log_fd: int, job: str) -> int:
        pid = procs.spawn(argv, env, cwd, log_fd)
        self._ours.add(pid)
        self._lifetimes.append(leaks.Lifetime(job, leaks.start_ticks(pid) or leaks.now_ticks()))
        del self._lifetimes[: -leaks.LIFETIMES_KEPT]
        self._forget_reads()
        return pid

    def reap(self) -> None:
        """Collect every child that ended: our jobs' codes are kept, orphans are just reaped."""
        self._forget_reads()  # every tick starts here, and so does each wait for processes being ended
        while True:
            try:
                # wait4: the rusage of a job's wrapper is that of its whole tree (every process it waited for)
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self._ours:
                self._exited[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                self._usage[pid] = accounting.from_rusage(rusage)

    def exit_code(self, pid: int) -> int | None:
        return self._exited.get(pid)

    def usage(self, pid: int) -> accounting.ReapedUsage | None:
        return self._usage.get(pid)

    def tree_rss_kb(self, run: Running) -> int:
        """The resident memory of RUN's processes together: its session's, from the descendants read once a tick."""
        mine = self.mine()
        return accounting.rss_kb(
            [run.pid, *(pid for pid, stat in mine.items() if stat[1] == run.pid and pid != run.pid)]
        )

    def forget(self, pid: int) -> None:
        self._ours.discard(pid)
        self._exited.pop(pid, None)
        self._usage.pop(pid, None)

    def child_waiting(self) -> bool:
        try:
            return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return False

    def tree(self, run: Running) -> list[procs.Proc]:
        """Every live process of RUN: in its cgroup, carrying its tag, or still in its session. Only this runner's
        descendants can carry its tag (it is their subreaper): only their environ is read. While we are the
        subreaper, the job's session is among them too (it began as the job's wrapper, our child, and none of
        it can be re-parented past us): only they are read, not every process on the machine."""
        me = os.getpid()
        pids = set(cgroups.cgroup_pids(run.cgroup)) if run.cgroup else set()
        mine = self.mine()
        table = mine if self._walk else self.stats()
        pids.update(
            pid
            for pid, (_, sid, state, *_) in table.items()
            if state not in ("Z", "X") and (sid == run.pid or (pid in mine and procs.read_tag(pid) == run.tag))
        )
        pids.discard(me)
        return [p for p in map(procs.read_proc, sorted(pids)) if p is not None and p.state not in ("Z", "X")]

    def end(self, pids: Iterable[int]) -> None:
        self._forget_reads()
        procs.end_processes(list(pids), self.kill_grace_s, self.reap)

    def end_cgroup(self, cgroup: str) -> list[int]:
        return cgroups.cgroup_kill(cgroup, 5.0, self.reap)

    def job_cgroup(self, base: str | None, filename: str) -> str | None:
        if not base:
            return None
        path = os.path.join(base, f"job-{filename}")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
        return path

    def leftovers(self, tag_prefix: str) -> list[procs.Proc]:
        return [p for p in procs.all_procs() if p.tag and p.tag.startswith(tag_prefix)]

    def job_ended(self, filename: str) -> None:
        for life in self._lifetimes:
            if life.job == filename and life.end is None:
                life.end = leaks.now_ticks()

    def leaks(self, leaders: set[int]) -> list[leaks.Leak]:
        return leaks.find(self._lifetimes, leaders, self.mine())

    def leak_owner(self, pid: int) -> str:
        return leaks.owner(self._lifetimes, leaks.start_ticks(pid))

    def alive(self, pid: int) -> bool:
        return procs.alive(pid)

    def gpu_holders(self, watch: GpuWatch, now: float, owner: Callable[[procs.Proc], str | None]) -> Observation:
        """Every GPU holder of the whole process table, sampled by WATCH."""
        return watch.observe(now, self.stats(), owner)

    def read_proc(self, pid: int) -> procs.Proc | None:
        return procs.read_proc(pid)

    def cgroup_pids(self, cgroup: str) -> list[int]:
        return cgroups.cgroup_pids(cgroup)
