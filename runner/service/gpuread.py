"""What the kernel and the driver say about GPUs, read once: the devices (sysfs), each process's DRM clients
(the drm-usage-stats in /proc/PID/fdinfo), AMD compute use (/sys/class/kfd/kfd/proc) and NVIDIA use (NVML).

Every path is read under `Roots` (procfs, sysfs, /dev), so a test builds the kernel's documented files in a
temporary directory and a runner in a container can read the host's through a bind mount.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from runner.records import Frozen, Record, fill

_PCI = re.compile(r"\A[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")
_DRM_NODE = re.compile(r"\A(card|renderD)(\d+)\Z")
_NVIDIA_NODE = re.compile(r"\Anvidia(\d+)\Z")
_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "ns": 1}


class Roots(NamedTuple):
    proc: str = "/proc"
    sys: str = "/sys"
    dev: str = "/dev"


class Device(Frozen):
    """One GPU as this runner numbers them: by PCI address, in order (CUDA_DEVICE_ORDER=PCI_BUS_ID's order)."""

    __slots__ = ("index", "pci", "driver", "nodes", "kfd_ids")
    index: int
    pci: str  # "0000:03:00.0"; the sysfs device's name where it is not a PCI device
    driver: str  # amdgpu, i915, xe, nvidia, ... ("" where sysfs does not say)
    nodes: tuple[str, ...]  # its /dev nodes: dri/card*, dri/renderD*, nvidiaN
    kfd_ids: tuple[int, ...]  # its gpu_id in the KFD topology (AMD compute), where it has one

    def __init__(
        self, index: int, pci: str, driver: str, nodes: tuple[str, ...], kfd_ids: tuple[int, ...] = ()
    ) -> None:
        fill(self, "index", index)
        fill(self, "pci", pci)
        fill(self, "driver", driver)
        fill(self, "nodes", nodes)
        fill(self, "kfd_ids", kfd_ids)


class Client(Record):
    """One DRM client (an open DRM file, `drm-client-id`) as its fdinfo describes it."""

    __slots__ = ("key", "driver", "pdev", "node", "engines", "cycles", "capacity", "memory")

    def __init__(
        self,
        key: tuple[str, str],
        driver: str,
        pdev: str,
        node: str,
        engines: dict[str, int] | None = None,
        cycles: dict[str, tuple[int, int]] | None = None,
        capacity: dict[str, int] | None = None,
        memory: int = 0,
    ) -> None:
        self.key = key  # (the device it is on: drm-pdev or the node, drm-client-id): counted once
        self.driver = driver
        self.pdev = pdev
        self.node = node  # the node its fd leads to
        self.engines: dict[str, int] = {} if engines is None else engines  # drm-engine-<e>: busy ns
        # drm-cycles-<e>, drm-total-cycles-<e>
        self.cycles: dict[str, tuple[int, int]] = {} if cycles is None else cycles
        # drm-engine-capacity-<e> (1 where not given)
        self.capacity: dict[str, int] = {} if capacity is None else capacity
        self.memory = memory  # bytes over its regions: drm-total-<r>, else drm-memory-<r>, else drm-resident-<r>

    @property
    def measured(self) -> bool:
        """Whether it says anything of its use (nvidia-drm's fdinfo names the driver and nothing more)."""
        return bool(self.engines or self.cycles or self.memory)

    @property
    def busy(self) -> int:
        """A counter that rises while the client works: its engines' busy ns, or busy cycles where only those
        are given (xe)."""
        return sum(self.engines.values()) if self.engines else sum(c for c, _ in self.cycles.values())


def parse_fdinfo(text: str, node: str) -> Client | None:
    """The DRM client in one /proc/PID/fdinfo/FD (Documentation/gpu/drm-usage-stats.rst): `key: value [unit]`
    lines, keys prefixed `drm-`; None where it is not a DRM file's (no drm-driver)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.startswith("drm-") and not any(c.isspace() for c in key):
            values[key] = value.strip()
    driver = values.get("drm-driver")
    if not driver:
        return None
    pdev = values.get("drm-pdev", "")
    client = Client((pdev or node, values.get("drm-client-id", f"{node}?")), driver, pdev, node)
    regions: dict[str, dict[str, int]] = {}  # region -> {total|memory|resident: bytes}
    for key, value in values.items():
        number = _number(value)
        if number is None:
            continue
        if key.startswith("drm-engine-capacity-"):
            client.capacity[key[20:]] = max(1, number)
        elif key.startswith("drm-engine-"):
            client.engines[key[11:]] = number
        elif key.startswith("drm-total-cycles-"):
            engine = key[17:]
            client.cycles[engine] = (client.cycles.get(engine, (0, 0))[0], number)
        elif key.startswith("drm-cycles-"):
            engine = key[11:]
            client.cycles[engine] = (number, client.cycles.get(engine, (0, 0))[1])
        else:
            for kind in ("total", "memory", "resident"):
                if key.startswith(f"drm-{kind}-"):
                    regions.setdefault(key[len(kind) + 5 :], {})[kind] = number
    for found in regions.values():
        client.memory += next((found[k] for k in ("total", "memory", "resident") if k in found), 0)
    return client


def _number(value: str) -> int | None:
    """`123`, `4 KiB`, `9288864723 ns` as a whole number (bytes, ns); None for anything else."""
    number, _, unit = value.partition(" ")
    if not number.isdigit() or unit.strip() not in _UNITS:
        return None
    return int(number) * _UNITS[unit.strip()]


class KfdUse(NamedTuple):
    """One process's use of one GPU through AMD's KFD (ROCm compute), from /sys/class/kfd/kfd/proc/PID/."""

    kfd_id: int
    vram: int  # vram_<id>: bytes
    sdma: int  # sdma_<id>: SDMA (copy engine) activity, a counter that rises
    cu_occupancy: int  # stats_<id>/cu_occupancy: compute units its waves occupy now


def kfd_users(roots: Roots) -> dict[int, list[KfdUse]]:
    """pid -> its KFD use per GPU: every process that opened /dev/kfd has a directory there (world-readable, so
    ROCm work of another user is seen even where its open files are not)."""
    top = os.path.join(roots.sys, "class/kfd/kfd/proc")
    try:
        pids = [p for p in os.listdir(top) if p.isdigit()]
    except OSError:
        return {}
    found: dict[int, list[KfdUse]] = {}
    for pid in pids:
        base = os.path.join(top, pid)
        try:
            names = os.listdir(base)
        except OSError:
            continue
        uses = []
        for name in names:
            if name.startswith("vram_") and name[5:].isdigit():
                ident = name[5:]
                uses.append(
                    KfdUse(
                        int(ident),
                        _read_int(os.path.join(base, name)),
                        _read_int(os.path.join(base, f"sdma_{ident}")),
                        _read_int(os.path.join(base, f"stats_{ident}", "cu_occupancy")),
                    )
                )
        found[int(pid)] = sorted(uses, key=lambda u: u.kfd_id)
    return found


def _read_int(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            text = handle.read(64).strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def _read_text(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode(errors="replace")
    except OSError:
        return None


# -- devices ------------------------------------------------------------------------------------
def find_devices(roots: Roots) -> list[Device]:
    """The GPUs sysfs shows: DRM devices (card*/renderD*) and devices bound to nvidia, by PCI address."""
    nodes: dict[str, list[str]] = {}
    drivers: dict[str, str] = {}
    drm = os.path.join(roots.sys, "class/drm")
    for name in _listdir(drm):
        if not _DRM_NODE.match(name):
            continue  # card0-HDMI-A-1 and the like are connectors, not devices
        device = os.path.realpath(os.path.join(drm, name, "device"))
        if not os.path.isdir(device):
            continue
        address = os.path.basename(device)
        nodes.setdefault(address, []).append(os.path.join(roots.dev, "dri", name))
        drivers[address] = os.path.basename(os.path.realpath(os.path.join(device, "driver")))
    nvidia_pci = os.path.join(roots.sys, "bus/pci/drivers/nvidia")
    for name in _listdir(nvidia_pci):
        if _PCI.match(name):
            nodes.setdefault(name, [])
            drivers[name] = "nvidia"
    order = sorted(nodes)
    # /dev/nvidiaN: the N-th device nvidia probed, which is PCI order
    nvidia = [a for a in order if drivers.get(a) == "nvidia"]
    for name in _listdir(roots.dev):
        match = _NVIDIA_NODE.match(name)
        if match and int(match.group(1)) < len(nvidia):
            nodes[nvidia[int(match.group(1))]].append(os.path.join(roots.dev, name))
    kfd = _kfd_topology(roots)
    devices = []
    for index, address in enumerate(order):
        minors = [int(m.group(2)) for n in nodes[address] if (m := _DRM_NODE.match(os.path.basename(n)))]
        devices.append(
            Device(
                index,
                address,
                drivers.get(address, ""),
                tuple(sorted(nodes[address])),
                tuple(sorted(gpu_id for gpu_id, minor in kfd.items() if minor in minors)),
            )
        )
    return devices


def _kfd_topology(roots: Roots) -> dict[int, int]:
    """KFD gpu_id -> the DRM render minor of that GPU (topology/nodes/N/properties' drm_render_minor)."""
    top = os.path.join(roots.sys, "class/kfd/kfd/topology/nodes")
    found = {}
    for node in _listdir(top):
        gpu_id = _read_int(os.path.join(top, node, "gpu_id"))
        if not gpu_id:
            continue  # a CPU node
        for line in (_read_text(os.path.join(top, node, "properties")) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "drm_render_minor" and value.strip().isdigit():
                found[gpu_id] = int(value)
    return found


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


# -- a process's GPU files -----------------------------------------------------------------------
class Held(Record):
    """The GPU nodes one process has open, and the DRM clients their fdinfo shows."""

    __slots__ = ("nodes", "clients")

    def __init__(self, nodes: list[str] | None = None, clients: list[Client] | None = None) -> None:
        self.nodes: list[str] = [] if nodes is None else nodes
        self.clients: list[Client] = [] if clients is None else clients


class NodeKinds:
    """Which paths are GPU nodes, and of which device: /dev/dri/*, /dev/kfd, /dev/nvidia*, /dev/accel/* under
    the /dev root, and stand-ins (`--gpu-device [N=]PATH`)."""

    def __init__(self, roots: Roots, devices: Sequence[Device], extra: Iterable[str] = ()) -> None:
        self.roots = roots
        self.extra: dict[str, int | None] = {}
        for item in extra:
            index, sep, path = item.partition("=")
            if sep and index.strip().isdigit():
                self.extra[path] = int(index)
            else:
                self.extra[item] = None
        dev = roots.dev.rstrip("/")
        self.prefixes = tuple(f"{dev}/{p}" for p in ("dri/", "kfd", "nvidia", "accel/"))
        self.by_node = {node: d.index for d in devices for node in d.nodes}
        self.by_pci = {d.pci: d.index for d in devices}

    def present(self) -> bool:
        """Whether any GPU node exists: where none does, no process can hold one and no fd is read."""
        if any(os.path.exists(p) for p in self.extra):
            return True
        dev = self.roots.dev
        return bool(
            _listdir(os.path.join(dev, "dri"))
            or os.path.exists(os.path.join(dev, "kfd"))
            or _listdir(os.path.join(dev, "accel"))
            or any(n.startswith("nvidia") for n in _listdir(dev))
        )

    def is_node(self, target: str) -> bool:
        return target in self.extra or target.startswith(self.prefixes)

    def device_of(self, target: str, client: Client | None) -> int | None:
        """The device a node (or the client on it) belongs to; None: not known (it counts for every device)."""
        if client is not None and client.pdev in self.by_pci:
            return self.by_pci[client.pdev]
        if target in self.extra:
            return self.extra[target]
        return self.by_node.get(target)


def read_held(roots: Roots, pid: int, kinds: NodeKinds) -> Held | None:
    """PID's GPU nodes and DRM clients; None where its fds cannot be listed (gone, or not in this procfs).
    PermissionError propagates: another user's process may hold a GPU we cannot see."""
    fd_dir = os.path.join(roots.proc, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except PermissionError:
        raise
    except OSError:
        return None
    held = Held()
    seen: set[tuple[str, str]] = set()
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if not kinds.is_node(target):
            continue
        if target not in held.nodes:
            held.nodes.append(target)
        text = _read_text(os.path.join(roots.proc, str(pid), "fdinfo", fd))
        client = parse_fdinfo(text, target) if text else None
        if client is not None and client.key not in seen:  # a client dup()ed to several fds counts once
            seen.add(client.key)
            held.clients.append(client)
    return held


# -- NVML -----------------------------------------------------------------------------------------
class NvmlUse(NamedTuple):
    pci: str
    memory: int  # bytes it holds on that GPU
    sm_util: int  # percent of the last samples (-1: not reported)


class NvmlSample(Record):
    __slots__ = ("state", "error", "users", "busy", "memory")

    def __init__(
        self,
        state: str,
        error: str = "",
        users: dict[int, list[NvmlUse]] | None = None,
        busy: dict[str, int] | None = None,
        memory: dict[str, int] | None = None,
    ) -> None:
        self.state = state  # "absent" (nvidia-ml-py not installed), "ok", "error"
        self.error = error
        self.users: dict[int, list[NvmlUse]] = {} if users is None else users
        self.busy: dict[str, int] = {} if busy is None else busy  # pci -> GPU utilisation percent
        self.memory: dict[str, int] = {} if memory is None else memory  # pci -> bytes used


def nvml_sample(last_seen: dict[str, int]) -> NvmlSample:
    """Every NVIDIA GPU's processes and use through NVML (nvidia-ml-py), where installed. Looked up at run time:
    the runner itself needs nothing outside the standard library. A failure is said, never an empty answer."""
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError:
        return NvmlSample("absent")
    sample = NvmlSample("ok")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: the module's own types
        return NvmlSample("error", f"nvmlInit: {exc}")
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pci = _nvml_pci(pynvml.nvmlDeviceGetPciInfo(handle))
            sample.busy[pci] = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            sample.memory[pci] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            util, newest = _process_util(pynvml, handle, last_seen.get(pci, 0))
            last_seen[pci] = max(last_seen.get(pci, 0), newest)  # the next look reads only newer samples
            infos = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            infos += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
            for info in infos:
                memory = info.usedGpuMemory if isinstance(info.usedGpuMemory, int) else 0
                sample.users.setdefault(int(info.pid), []).append(NvmlUse(pci, memory, util.get(int(info.pid), -1)))
    except Exception as exc:
        sample.state, sample.error = "error", f"{type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return sample


def _process_util(pynvml: object, handle: object, since: int) -> tuple[dict[int, int], int]:
    """pid -> its highest SM utilisation in NVML's samples since SINCE (µs), and the newest sample's time; ({}, 0)
    where the GPU keeps none."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)  # type: ignore[attr-defined]
    except Exception:
        return {}, 0  # NVML_ERROR_NOT_FOUND: no sample in that span
    util: dict[int, int] = {}
    for s in samples:
        util[int(s.pid)] = max(util.get(int(s.pid), 0), int(s.smUtil))
    return util, max((int(getattr(s, "timeStamp", 0)) for s in samples), default=0)


def _nvml_pci(info: object) -> str:
    """NVML's busId ("00000000:03:00.0") as sysfs names the device ("0000:03:00.0")."""
    bus = getattr(info, "busId", b"")
    text = bus.decode() if isinstance(bus, bytes) else str(bus)
    return text[-12:].lower() if len(text) >= 12 else text.lower()
