"""Process ownership: jobs in their own session with a tag; what they leave is ended; foreign GPU users found."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Tuple

from runner.cgroups import cgroup_usable as cgroup_usable  # moved there; named here as before
from runner.files import drain

TAG_VAR = "PLAN_RUNNER_TAG"
JOB_VAR = "PLAN_RUNNER_JOB"
PR_SET_CHILD_SUBREAPER = 36


class Proc(NamedTuple):
    pid: int
    ppid: int
    sid: int
    state: str
    comm: str
    cmdline: str
    tag: str | None  # None: environ unreadable or untagged


def set_child_subreaper() -> bool:
    """Orphans of our jobs come back to us instead of PID 1 (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def spawn(argv: Sequence[str], env: dict[str, str], cwd: str, log_fd: int) -> int:
    """Start ARGV in a new session, output to LOG_FD (never a pipe: a server left behind would hold it)."""
    exe = shutil.which(argv[0]) or argv[0]
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        old = os.getcwd()
        os.chdir(cwd)
        try:
            return os.posix_spawn(
                exe,
                list(argv),
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                ],
                setsid=True,
                setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE),
                setsigmask=(),
            )
        finally:
            os.chdir(old)
    finally:
        os.close(devnull)


def _read(path: str, whole: bool = True) -> bytes | None:
    """PATH's bytes, through the os calls alone: a buffered file object costs as much again as the read (an
    fstat, two objects), and every process's stat is read before a gpu-lane start. Not WHOLE: one read, for a
    file that always fits (/proc/PID/stat is one line of a few hundred bytes, made whole at the first read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not whole:
            return os.read(fd, 1 << 16)
        return drain(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


# (ppid, sid, state, comm, kernel thread) of a process, from /proc/PID/stat alone
Stat = Tuple[int, int, str, str, bool]
PF_KTHREAD = 0x00200000  # in the flags field: a kernel thread (no cmdline, no files of its own)


def read_stat(pid: int) -> Stat | None:
    raw = _read(f"/proc/{pid}/stat", whole=False)
    if raw is None:
        return None
    rpar = raw.rfind(b")")  # the name may hold anything, ")" and spaces too: the fields follow the last ")"
    fields = raw[rpar + 2 :].split(None, 7)  # state ppid pgrp sid tty tpgid flags: the rest is not read
    try:
        kthread = bool(int(fields[6]) & PF_KTHREAD)
        comm = raw[raw.find(b"(") + 1 : rpar].decode(errors="replace")
        return int(fields[1]), int(fields[3]), fields[0].decode(), comm, kthread
    except (IndexError, ValueError):
        return None


def all_stats() -> dict[int, Stat]:
    """pid -> its stat of every process: one read each (cmdline and environ are read only for those that matter;
    at a job's end this runs before its lane's next job may start)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = read_stat(int(entry))
            if found is not None:
                table[int(entry)] = found
    return table


def children_files() -> bool:
    """Whether this kernel lists a task's children in /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendant_stats(top: int) -> dict[int, Stat]:
    """pid -> its stat of every process below TOP, found from TOP down through the kernel's lists of each
    task's children: a read per descendant, not one per process on the machine (where `children_files()`)."""
    table: dict[int, Stat] = {}
    todo = [top]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile: its children were re-parented, to us (the subreaper) or below us
        for task in tasks:
            for child in (_read(f"/proc/{pid}/task/{task}/children") or b"").split():
                found = read_stat(int(child))
                if found is not None and int(child) not in table:
                    table[int(child)] = found
                    todo.append(int(child))
    return table


def proc_of(pid: int, found: Stat) -> Proc:
    """PID as a Proc, from its stat as read (its cmdline and environ read now)."""
    ppid, sid, state, comm, _ = found
    return Proc(pid, ppid, sid, state, comm, read_cmdline(pid) or f"[{comm}]", read_tag(pid))


def read_cmdline(pid: int) -> str:
    cmd = _read(f"/proc/{pid}/cmdline") or b""
    return cmd.replace(b"\0", b" ").decode(errors="replace").strip()


def brief_command(cmd: str, limit: int) -> str:
    """CMD in at most LIMIT characters; one longer has its program by base name, so that a long path
    (/home/u/miniconda3/envs/x/bin/python, a scratch directory's copy) does not push the program's name out."""
    if len(cmd) > limit:
        program, sep, rest = cmd.partition(" ")
        cmd = program.rsplit("/", 1)[-1] + sep + rest
    return cmd[:limit]


def read_tag(pid: int) -> str | None:
    env = _read(f"/proc/{pid}/environ")
    if env:
        prefix = TAG_VAR.encode() + b"="
        for item in env.split(b"\0"):
            if item.startswith(prefix):
                return item[len(prefix) :].decode(errors="replace")
    return None


def read_proc(pid: int) -> Proc | None:
    found = read_stat(pid)
    return None if found is None else proc_of(pid, found)


def all_procs() -> list[Proc]:
    return [proc_of(pid, found) for pid, found in all_stats().items()]


def descendants(table: dict[int, Stat], top: int) -> set[int]:
    """Every process below TOP in TABLE (TOP left out)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(top, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie (a killed process can linger as Z until its parent reaps it)."""
    proc = read_proc(pid)
    return proc is not None and proc.state not in ("Z", "X")


def end_processes(pids: Iterable[int], grace_s: float, reap: Callable[[], None]) -> list[int]:
    """TERM each pid, wait up to GRACE_S (reaping our own children meanwhile), then KILL the rest."""
    pids = [p for p in pids if p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    killed = []
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    end = time.monotonic() + 2.0
    while time.monotonic() < end and any(alive(p) for p in killed):
        reap()
        time.sleep(0.02)
    return killed


class GpuUser(NamedTuple):
    pid: int
    ppid: int
    cmd: str
    why: str  # "name", "engine time rising on GPU 0", "device /dev/dri/renderD128 (its use cannot be read)", ...
    devices: tuple[int, ...] = ()  # the GPUs it holds; (): not known which (it counts for every one)
