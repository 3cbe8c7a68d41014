"""Foreign GPU users: processes not ours that use the GPU, by name, by an open device node, or as NVML lists them."""

from __future__ import annotations

import importlib
import os
import stat
import time
from collections.abc import Callable, Sequence

from runner.procs import GpuUser, Proc, Stat, all_stats, proc_of, read_cmdline, read_proc

# Character-device majors of GPU nodes: 226 DRM (/dev/dri/*), 261 accel, 195 nvidia, and
# the AMD kfd major is dynamic, so /dev/kfd is matched by path as well.
GPU_MAJORS = frozenset({226, 261, 195})
GPU_PATH_PREFIXES = ("/dev/nvidia", "/dev/dri/renderD", "/dev/dri/card", "/dev/kfd", "/dev/accel/")


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


NODE_DIRS = ("/dev", "/dev/dri", "/dev/accel")
_nodes_seen: dict[tuple[int, ...], bool] = {}  # the mtimes of NODE_DIRS -> whether a GPU node was there


def gpu_nodes_exist() -> bool:
    """Whether /dev holds a GPU node (by name or by major). Where none does, no process can have one open, and
    reading every process's fds before each start in the GPU lane would find nothing. Looked for again only
    when a node is added or removed (the directories' mtimes change): this runs before each start there."""
    mtimes = []
    for top in NODE_DIRS:
        try:
            mtimes.append(os.stat(top).st_mtime_ns)
        except OSError:
            mtimes.append(0)
    key = tuple(mtimes)
    if key in _nodes_seen:
        return _nodes_seen[key]
    found = _look_for_nodes()
    # Kept only once the directories are a second old: a node added within the same clock tick as the change
    # before it would leave their mtimes as they were.
    if max(mtimes) < time.time_ns() - 1_000_000_000:
        _nodes_seen.clear()
        _nodes_seen[key] = found
    return found


def _look_for_nodes() -> bool:
    for top in NODE_DIRS:
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
        if stat_of[4]:  # a kernel thread: no argv, no files; only its name can match
            why = "name" if stat_of[3] in names else None
        else:
            why = _gpu_use(pid, stat_of[3], names, device_paths, nodes if scan_fds else None)
        if why is None:
            continue
        proc = proc_of(pid, stat_of)
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
    if nodes is None and os.access(f"/proc/{pid}/fd", os.R_OK):
        return None  # its fds are readable and none can be a GPU node: not listed (one call, not a listing)
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
    return os.path.basename((read_cmdline(pid) or f"[{comm}]").split(" ", 1)[0])


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
