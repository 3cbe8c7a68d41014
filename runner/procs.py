"""Process ownership: jobs in their own session with a tag; what they leave is ended; foreign GPU users found."""

from __future__ import annotations

import ctypes
import importlib
import os
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from runner.cgroups import cgroup_usable as cgroup_usable  # moved there; named here as before

TAG_VAR = "PLAN_RUNNER_TAG"
JOB_VAR = "PLAN_RUNNER_JOB"
PR_SET_CHILD_SUBREAPER = 36
# Character-device majors of GPU nodes: 226 DRM (/dev/dri/*), 261 accel, 195 nvidia, and
# the AMD kfd major is dynamic, so /dev/kfd is matched by path as well.
GPU_MAJORS = frozenset({226, 261, 195})
GPU_PATH_PREFIXES = ("/dev/nvidia", "/dev/dri/renderD", "/dev/dri/card", "/dev/kfd", "/dev/accel/")


@dataclass(frozen=True)
class Proc:
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


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


Stat = tuple[int, int, str, str]  # (ppid, sid, state, comm) of a process, from /proc/PID/stat alone


def read_stat(pid: int) -> Stat | None:
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    text = raw.decode(errors="replace")
    lpar, rpar = text.find("("), text.rfind(")")
    fields = text[rpar + 2 :].split()
    try:
        return int(fields[1]), int(fields[3]), fields[0], text[lpar + 1 : rpar]
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


def _proc(pid: int, found: Stat) -> Proc:
    ppid, sid, state, comm = found
    cmd = _read(f"/proc/{pid}/cmdline") or b""
    cmdline = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
    return Proc(pid, ppid, sid, state, comm, cmdline or f"[{comm}]", read_tag(pid))


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
    return None if found is None else _proc(pid, found)


def all_procs() -> list[Proc]:
    return [_proc(pid, found) for pid, found in all_stats().items()]


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


@dataclass(frozen=True)
class GpuUser:
    pid: int
    ppid: int
    cmd: str
    why: str  # "name", "device /dev/dri/renderD128", "nvml", "unreadable"


def _is_gpu_node(target: str, extra_paths: Sequence[str]) -> bool:
    if any(target == p or target.startswith(p.rstrip("/") + "/") for p in extra_paths):
        return True
    if not target.startswith("/dev/"):
        return False
    if target.startswith(GPU_PATH_PREFIXES):
        return True
    try:
        st = os.stat(target)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in GPU_MAJORS


def gpu_nodes_exist() -> bool:
    """Whether /dev holds a GPU node (by name or by major). Where none does, no process can have one open, and
    reading every process's fds before each start in the GPU lane would find nothing."""
    for top in ("/dev", "/dev/dri", "/dev/accel"):
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            if entry.path.startswith(GPU_PATH_PREFIXES):
                return True
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in GPU_MAJORS:
                return True
    return False


def gpu_users(
    names: Sequence[str],
    device_paths: Sequence[str],
    is_ours: Callable[[Proc], bool],
    stats: dict[int, Stat] | None = None,
) -> tuple[list[GpuUser], list[int]]:
    """Processes not ours that use the GPU (by name or open device node), and pids whose fds we could not read.
    A process's cmdline and environ are read only once it is a GPU user (or unreadable): whether it is ours
    matters only then, and this runs before every start in the GPU lane."""
    found: list[GpuUser] = []
    unreadable: list[int] = []
    me = os.getpid()
    nodes: dict[str, bool] = {}  # fd target -> a GPU node: /dev/null and the ttys stat()ed once
    scan_fds = bool(device_paths) or gpu_nodes_exist()  # no GPU node on this machine: none can be open
    for pid, stat_of in (all_stats() if stats is None else stats).items():
        if pid == me or stat_of[2] in ("Z", "X"):
            continue
        why = _gpu_use(pid, stat_of[3], names, device_paths, nodes if scan_fds else None)
        if why is None:
            continue
        proc = _proc(pid, stat_of)
        if is_ours(proc):
            continue
        if why == "unreadable":
            if proc.ppid != 2 and pid != 2:  # kernel threads have no fds to read
                unreadable.append(pid)
            continue
        found.append(GpuUser(pid, proc.ppid, proc.cmdline, why))
    found.extend(_nvml_users(is_ours, {u.pid for u in found}))
    return found, unreadable


def _gpu_use(
    pid: int, comm: str, names: Sequence[str], device_paths: Sequence[str], nodes: dict[str, bool] | None
) -> str | None:
    """How PID uses the GPU: "name", "device PATH", "unreadable" (its fds), or None. NODES None: where its fds
    lead is not looked at (there is no GPU node to have open)."""
    if comm in names or (names and _argv0(pid, comm) in names):
        return "name"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return "unreadable"  # whatever this machine's /dev holds: it may see a GPU we do not
    except OSError:
        return None
    if nodes is None:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        gpu = nodes.get(target)
        if gpu is None:
            gpu = nodes[target] = _is_gpu_node(target, device_paths)
        if gpu:
            return f"device {target}"
    return None


def _argv0(pid: int, comm: str) -> str:
    cmdline = (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
    return os.path.basename((cmdline or f"[{comm}]").split(" ", 1)[0])


def _nvml_users(is_ours: Callable[[Proc], bool], seen: set[int]) -> list[GpuUser]:
    try:
        # Optional and looked up at run time: the runner itself needs nothing outside the standard library.
        pynvml = importlib.import_module("pynvml")  # from nvidia-ml-py, where installed
    except ImportError:
        return []
    users: list[GpuUser] = []
    try:
        pynvml.nvmlInit()
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                infos = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
                infos += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
                for info in infos:
                    proc = read_proc(info.pid)
                    if info.pid in seen or info.pid == os.getpid() or (proc and is_ours(proc)):
                        continue
                    seen.add(info.pid)
                    users.append(GpuUser(info.pid, proc.ppid if proc else 0, proc.cmdline if proc else "?", "nvml"))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return users
    return users
