"""Who holds each GPU and whether they use it: samples of every holder's engine time and memory, kept across
ticks, judged over a short window. A foreign holder blocks only while it uses the GPU (or by its name).

The door to GPU use: `GpuWatch`, `Roots`, `find_devices`, `gpu_status` (`python3 -m runner gpus` reads them too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from runner.config import GPU_IGNORE
from runner.procs import GpuUser, Proc, Stat, brief_command, proc_of, read_cmdline
from runner.service import gpuread
from runner.service.gpuread import Client, Device, NodeKinds, Roots, find_devices


@dataclass(frozen=True)
class GpuRules:
    """How holders are judged (the runner's gpu flags)."""

    names: tuple[str, ...] = ()  # processes that block by name, whatever their use
    ignore: tuple[str, ...] = GPU_IGNORE
    window_s: float = 30.0  # a holder's use is judged over this long
    memory_bytes: int = 1 << 30  # a holder with this much GPU memory uses the GPU, busy or not
    extra_nodes: tuple[str, ...] = ()  # --gpu-device [N=]PATH stand-ins
    roots: Roots = field(default_factory=Roots)


class Holder(NamedTuple):
    """A process holding a GPU, as judged now."""

    pid: int
    ppid: int
    cmd: str
    who: str  # "ours", "foreign", "ignored"
    job: str  # ours: the job it belongs to
    devices: tuple[int, ...]  # the GPUs it holds; (): not known which (it counts for every one)
    uses: bool
    why: str  # what it was judged by: "name", "engine busy 40% on GPU 0", "idle 5m", ...
    memory: int = 0

    def user(self) -> GpuUser:
        return GpuUser(self.pid, self.ppid, self.cmd, self.why, self.devices)

    def on(self, device: int) -> bool:
        return not self.devices or device in self.devices


@dataclass(frozen=True)
class DeviceView:
    index: int
    pci: str
    driver: str
    busy: float | None  # fraction of the busiest engine since the last sample; None: not known
    memory: int  # bytes its holders hold
    ours: tuple[str, ...]  # jobs
    foreign: tuple[int, ...]
    ignored: tuple[int, ...]


@dataclass
class JobGpu:
    """A job of ours on the GPU: when its engine time last moved, how long it was seen busy."""

    devices: tuple[int, ...]
    seen_at: float  # first sample where it had a GPU client whose use can be read
    moved_at: float
    active_s: float = 0.0
    watched_s: float = 0.0
    busy: float | None = None
    memory: int = 0


@dataclass
class Observation:
    at: float
    devices: list[DeviceView] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    unreadable: list[int] = field(default_factory=list)  # pids whose open files this runner cannot read
    errors: list[str] = field(default_factory=list)
    nvml: str = "absent"

    def blocking(self) -> list[Holder]:
        return [h for h in self.holders if h.who == "foreign" and h.uses]

    def idle(self) -> list[Holder]:
        """Holders that do not hold the lane: ignored ones, and foreign ones not using the GPU."""
        return [h for h in self.holders if h.who == "ignored" or (h.who == "foreign" and not h.uses)]


@dataclass
class _Sample:
    at: float
    counters: dict[tuple[object, ...], int]  # what rises while it works: engine ns, busy cycles, SDMA activity
    active: bool  # something says it works now (KFD compute units occupied, NVML SM utilisation)
    measured: bool  # some of its use can be read


__all__ = ["GpuRules", "GpuWatch", "Observation", "Roots", "find_devices", "gpu_status"]


class GpuWatch:
    """Samples GPU holders (`observe`) and keeps what judging their use over the window needs."""

    def __init__(self, rules: GpuRules) -> None:
        self.rules = rules
        self.history: dict[int, list[_Sample]] = {}  # pid -> its samples, newest last, back to one before the window
        self.clients: dict[tuple[str, str], tuple[float, Client]] = {}  # last sample of each DRM client
        self.jobs: dict[str, JobGpu] = {}
        self.last: Observation | None = None
        self._nvml_absent = False
        self._nvml_seen: dict[str, int] = {}

    def forget_job(self, job: str) -> JobGpu | None:
        return self.jobs.pop(job, None)

    def observe(self, now: float, table: dict[int, Stat], owner: Callable[[Proc], str | None]) -> Observation:
        """One sample of every GPU holder in TABLE. OWNER names the job a process of ours belongs to ("" where
        it is ours but the job is not known), None for a process not ours."""
        rules = self.rules
        devices = find_devices(rules.roots)
        kinds = NodeKinds(rules.roots, devices, rules.extra_nodes)
        obs = Observation(now)
        kfd = gpuread.kfd_users(rules.roots)
        nvml = self._nvml(devices, kinds)
        obs.nvml = nvml.state if nvml else "absent"
        if nvml and nvml.error:
            obs.errors.append(f"nvml: {nvml.error}")
        elif self._nvml_absent:
            obs.errors.append(
                "nvml: nvidia-ml-py is not installed: an NVIDIA GPU's holders are judged by their open nodes alone"
            )
        by_kfd = {kfd_id: d.index for d in devices for kfd_id in d.kfd_ids}
        by_pci = {d.pci: d.index for d in devices}
        scan_fds = kinds.present()
        me = os.getpid()
        seen: set[int] = set()
        unique: dict[tuple[str, str], tuple[Client, int | None]] = {}  # each DRM client once, with its device
        mine: dict[str, list[tuple[Holder, list[_Sample]]]] = {}  # job of ours -> its processes on the GPU
        for pid, stat in table.items():
            if pid == me or stat[2] in ("Z", "X") or stat[4]:
                continue
            held: gpuread.Held | None = None
            if scan_fds:
                try:
                    held = gpuread.read_held(rules.roots, pid, kinds)
                except PermissionError:
                    if stat[0] != 2:  # kthreadd's children have no files of their own
                        obs.unreadable.append(pid)
            elif stat[0] != 2 and not os.access(os.path.join(rules.roots.proc, str(pid), "fd"), os.R_OK):
                # No GPU node here, but another user's process may see one we do not (one call, not a listing)
                if _forbidden(os.path.join(rules.roots.proc, str(pid), "fd")):
                    obs.unreadable.append(pid)
            named = self._named(pid, stat[3], held is not None and bool(held.nodes))
            uses_kfd, uses_nvml = kfd.get(pid, []), (nvml.users.get(pid, []) if nvml else [])
            if named != "block" and not (held and held.nodes) and not uses_kfd and not uses_nvml:
                continue  # holds no GPU (an ignored name holding none is nothing to show)
            proc = proc_of(pid, stat)
            job = owner(proc)
            held = held or gpuread.Held()
            where: set[int] = set()
            for client in held.clients:
                device = kinds.device_of(client.node, client)
                unique.setdefault(client.key, (client, device))
                if device is not None:
                    where.add(device)
            where.update(d for n in held.nodes if (d := kinds.device_of(n, None)) is not None)
            where.update(by_kfd[u.kfd_id] for u in uses_kfd if u.kfd_id in by_kfd)
            where.update(by_pci[u.pci] for u in uses_nvml if u.pci in by_pci)
            sample = _Sample(
                now,
                {
                    **{("drm", *c.key): c.busy for c in held.clients if c.measured},
                    **{("sdma", u.kfd_id): u.sdma for u in uses_kfd},
                },
                any(u.cu_occupancy > 0 for u in uses_kfd) or any(u.sm_util > 0 for u in uses_nvml),
                any(c.measured for c in held.clients) or bool(uses_kfd) or bool(uses_nvml),
            )
            memory = sum(c.memory for c in held.clients) + sum(u.vram for u in uses_kfd)
            memory += sum(u.memory for u in uses_nvml)
            seen.add(pid)
            history = self._keep(pid, sample)
            holder = self._judge(proc, job, named, held, tuple(sorted(where)), history, memory)
            obs.holders.append(holder)
            if job:
                mine.setdefault(job, []).append((holder, history))
        self._jobs(now, mine)
        for pid in [p for p in self.history if p not in seen]:
            del self.history[pid]
        obs.devices = self._devices(now, devices, unique, obs.holders, nvml)
        self.last = obs
        return obs

    # -- one holder ----------------------------------------------------------------------------------
    def _named(self, pid: int, comm: str, holder: bool) -> str:
        """ "block" or "ignore" where PID's name is in those lists, else "". argv[0] is read only where the
        name may be cut short (comm holds 15 characters) or the process holds a GPU node."""
        names, ignore = self.rules.names, self.rules.ignore
        if comm in ignore:
            return "ignore"
        if comm in names:
            return "block"
        if (holder or len(comm) >= 15) and (names or ignore):
            argv0 = os.path.basename((read_cmdline(pid) or "").split(" ", 1)[0])
            if argv0 in ignore:
                return "ignore"
            if argv0 in names:
                return "block"
        return ""

    def _keep(self, pid: int, sample: _Sample) -> list[_Sample]:
        """PID's samples with SAMPLE added, back to the newest one at least a window old."""
        history = self.history.setdefault(pid, [])
        history.append(sample)
        cutoff = sample.at - self.rules.window_s
        old = [i for i, s in enumerate(history) if s.at <= cutoff]
        if len(old) > 1:
            del history[: old[-1]]
        return history

    def _judge(
        self,
        proc: Proc,
        job: str | None,
        named: str,
        held: gpuread.Held,
        devices: tuple[int, ...],
        history: list[_Sample],
        memory: int,
    ) -> Holder:
        now, window = history[-1].at, self.rules.window_s
        where = f"GPU {','.join(map(str, devices))}" if devices else "the GPU"

        def made(who: str, uses: bool, why: str) -> Holder:
            return Holder(proc.pid, proc.ppid, proc.cmdline, who, job or "", devices, uses, why, memory)

        if job is not None:
            return made("ours", True, "ours")
        if named == "ignore":
            return made("ignored", False, "ignored by name (--gpu-ignore)")
        if named == "block":
            return made("foreign", True, "name")
        if memory >= self.rules.memory_bytes:
            return made("foreign", True, f"holds {_size(memory)} of GPU memory on {where}")
        if not history[-1].measured:
            node = held.nodes[0] if held.nodes else "a GPU"
            return made("foreign", True, f"device {node} (its use cannot be read)")
        rose = _rose(history)
        if rose:
            return made("foreign", True, f"engine time rising on {where}")
        if any(s.active for s in history if s.at > now - window):
            return made("foreign", True, f"computing on {where}")
        span = now - history[0].at
        if span < window:
            return made("foreign", True, f"first seen {_secs(span)} ago: its use is judged over {_secs(window)}")
        return made("foreign", False, f"idle on {where} for {_secs(span)}+")

    def _jobs(self, now: float, mine: dict[str, list[tuple[Holder, list[_Sample]]]]) -> None:
        """Each job of ours seen on the GPU: whether any of its processes' engine time moved since the last
        sample (its time watched and busy counted once, however many of its processes hold the GPU)."""
        for job, held in mine.items():
            measured = [(h, hist) for h, hist in held if hist[-1].measured]
            if not measured:
                continue
            gpu = self.jobs.get(job)
            if gpu is None:
                gpu = self.jobs[job] = JobGpu((), now, now)
            moved = any(hist[-1].active or (len(hist) > 1 and _rose(hist[-2:])) for _, hist in measured)
            if moved:
                gpu.moved_at = now
            steps = [now - hist[-2].at for _, hist in measured if len(hist) > 1]
            if steps:
                gpu.watched_s += max(steps)
                if moved:
                    gpu.active_s += max(steps)
            gpu.devices = tuple(sorted({*gpu.devices, *(d for h, _ in measured for d in h.devices)}))
            gpu.memory = sum(h.memory for h, _ in measured)

    # -- devices -------------------------------------------------------------------------------------
    def _devices(
        self,
        now: float,
        devices: Sequence[Device],
        unique: dict[tuple[str, str], tuple[Client, int | None]],
        holders: list[Holder],
        nvml: gpuread.NvmlSample | None,
    ) -> list[DeviceView]:
        busy: dict[int, dict[str, float]] = {}  # device -> engine -> fraction busy since the last sample
        memory: dict[int, int] = {}
        for key, (client, device) in unique.items():
            if device is None:
                continue
            memory[device] = memory.get(device, 0) + client.memory
            last = self.clients.get(key)
            if last is not None and now > last[0]:
                for engine, fraction in _fractions(client, last[1], now - last[0]).items():
                    busy.setdefault(device, {})[engine] = busy.get(device, {}).get(engine, 0.0) + fraction
            else:
                busy.setdefault(device, {})
        self.clients = {key: (now, client) for key, (client, _) in unique.items()}
        views = []
        for d in devices:
            on = [h for h in holders if h.on(d.index)]
            engines = busy.get(d.index)
            load: float | None = min(1.0, max(engines.values())) if engines else (0.0 if engines == {} else None)
            used = memory.get(d.index, 0)
            if nvml and d.pci in nvml.busy:
                load, used = nvml.busy[d.pci] / 100, nvml.memory.get(d.pci, used)
            views.append(
                DeviceView(
                    d.index,
                    d.pci,
                    d.driver,
                    load,
                    used,
                    tuple(sorted({h.job for h in on if h.who == "ours"})),
                    tuple(h.pid for h in on if h.who == "foreign"),
                    tuple(h.pid for h in on if h.who == "ignored"),
                )
            )
        return views

    def _nvml(self, devices: Sequence[Device], kinds: NodeKinds) -> gpuread.NvmlSample | None:
        """NVML's view, where there is an NVIDIA GPU and nvidia-ml-py is installed (looked for once)."""
        if self._nvml_absent or not any(d.driver == "nvidia" for d in devices):
            return None
        sample = gpuread.nvml_sample(self._nvml_seen)
        if sample.state == "absent":
            self._nvml_absent = True
            return None
        return sample


def gpu_status(
    seen: Observation | None, lane_gpus: list[int], given: dict[str, tuple[int, ...]] | None = None
) -> dict[str, Any]:
    """status.json's `gpus`: each GPU (busy, memory, whose), each holder (ours, foreign or ignored, and whether it
    uses the GPU), what could not be read. As of the last look (the runner looks while the gpu lane has work);
    GIVEN (running job -> the GPUs it was given) adds our jobs that hold no GPU node yet."""
    given = given or {}
    if seen is None:
        return {"seen": None, "lane_gpus": list(lane_gpus), "devices": [], "holders": [], "errors": []}
    return {
        "seen": seen.at,
        "lane_gpus": list(lane_gpus),
        "nvml": seen.nvml,
        "errors": list(seen.errors),
        "devices": [
            {
                "gpu": d.index,
                "pci": d.pci,
                "driver": d.driver,
                "busy_pct": None if d.busy is None else round(d.busy * 100),
                "memory": d.memory,
                "ours": sorted({*d.ours, *(job for job, gpus in given.items() if d.index in gpus)}),
                "foreign": list(d.foreign),
                "ignored": list(d.ignored),
            }
            for d in seen.devices
        ],
        "holders": [
            {
                "pid": h.pid,
                "cmd": brief_command(h.cmd, 120),
                "who": h.who,
                "job": h.job or None,
                "gpus": list(h.devices),
                "uses": h.uses,
                "why": h.why,
                "memory": h.memory,
            }
            for h in seen.holders[:50]
        ],
    }


def _forbidden(path: str) -> bool:
    try:
        os.listdir(path)
    except PermissionError:
        return True
    except OSError:
        pass
    return False


def _rose(history: list[_Sample]) -> bool:
    """Whether a counter in the newest sample is above what the oldest one had (a new counter above 0: its
    client began within the span). A counter that went down is not a rise (drm-usage-stats: stay with the
    larger value until the driver catches up)."""
    first, last = history[0].counters, history[-1].counters
    return any(value > first.get(key, 0) for key, value in last.items())


def _fractions(now: Client, then: Client, seconds: float) -> dict[str, float]:
    """Engine -> the fraction of it CLIENT kept busy between two samples."""
    found = {}
    for engine, ns in now.engines.items():
        delta = max(0, ns - then.engines.get(engine, ns))
        found[engine] = delta / (seconds * 1e9 * now.capacity.get(engine, 1))
    for engine, (cycles, total) in now.cycles.items():
        before = then.cycles.get(engine)
        if before is not None and total > before[1]:
            found[engine] = max(0, cycles - before[0]) / ((total - before[1]) * now.capacity.get(engine, 1))
    return found


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _secs(seconds: float) -> str:
    from runner.durations import format_duration

    return format_duration(seconds)
