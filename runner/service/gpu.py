"""Who holds each GPU and whether they use it: samples of every holder's engine time and memory, kept across
ticks, judged over a short window. A foreign holder blocks only while it uses the GPU (or by its name).

The door to GPU use: `GpuWatch`, `Roots`, `find_devices`, `gpu_status` (`python3 -m runner gpus` reads them too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from runner.procs import Proc, Stat, proc_of, read_cmdline
from runner.service import gpuread
from runner.service.gpuread import Client, Device, NodeKinds, Roots, find_devices
from runner.service.gpuseen import DeviceView, GpuRules, Holder, JobGpu, Observation, gpu_status


class _Sample:
    __slots__ = ("at", "counters", "active", "measured")

    def __init__(self, at: float, counters: dict[tuple[object, ...], int], active: bool, measured: bool) -> None:
        self.at = at
        self.counters = counters  # what rises while it works: engine ns, busy cycles, SDMA activity
        self.active = active  # something says it works now (KFD compute units occupied, NVML SM utilisation)
        self.measured = measured  # some of its use can be read


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
