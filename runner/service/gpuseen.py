"""What the GPU watch (runner.service.gpu) saw and judges by, as records, and `gpu_status`, status.json's view
of it. Its own module: runner.service.gpu is the door to them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from runner.config import GPU_IGNORE
from runner.procs import GpuUser, brief_command
from runner.records import Frozen, Record, fill

if TYPE_CHECKING:
    from runner.service.gpuread import Roots


class GpuRules(Frozen):
    """How holders are judged (the runner's gpu flags; a frozen record: runner.records)."""

    __slots__ = ("names", "ignore", "window_s", "memory_bytes", "extra_nodes", "roots")
    names: tuple[str, ...]  # processes that block by name, whatever their use
    ignore: tuple[str, ...]
    window_s: float  # a holder's use is judged over this long
    memory_bytes: int  # a holder with this much GPU memory uses the GPU, busy or not
    extra_nodes: tuple[str, ...]  # --gpu-device [N=]PATH stand-ins
    roots: Roots

    def __init__(
        self,
        names: tuple[str, ...] = (),
        ignore: tuple[str, ...] = GPU_IGNORE,
        window_s: float = 30.0,
        memory_bytes: int = 1 << 30,
        extra_nodes: tuple[str, ...] = (),
        roots: Roots | None = None,
    ) -> None:
        fill(self, "names", names)
        fill(self, "ignore", ignore)
        fill(self, "window_s", window_s)
        fill(self, "memory_bytes", memory_bytes)
        fill(self, "extra_nodes", extra_nodes)
        if roots is None:
            from runner.service.gpuread import Roots  # here: status.json's gpu_status needs no GPU reader

            roots = Roots()
        fill(self, "roots", roots)


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


class DeviceView(Frozen):
    __slots__ = ("index", "pci", "driver", "busy", "memory", "ours", "foreign", "ignored")
    index: int
    pci: str
    driver: str
    busy: float | None  # fraction of the busiest engine since the last sample; None: not known
    memory: int  # bytes its holders hold
    ours: tuple[str, ...]  # jobs
    foreign: tuple[int, ...]
    ignored: tuple[int, ...]

    def __init__(
        self,
        index: int,
        pci: str,
        driver: str,
        busy: float | None,
        memory: int,
        ours: tuple[str, ...],
        foreign: tuple[int, ...],
        ignored: tuple[int, ...],
    ) -> None:
        fill(self, "index", index)
        fill(self, "pci", pci)
        fill(self, "driver", driver)
        fill(self, "busy", busy)
        fill(self, "memory", memory)
        fill(self, "ours", ours)
        fill(self, "foreign", foreign)
        fill(self, "ignored", ignored)


class JobGpu(Record):
    """A job of ours on the GPU: when its engine time last moved, how long it was seen busy."""

    __slots__ = ("devices", "seen_at", "moved_at", "active_s", "watched_s", "busy", "memory")

    def __init__(
        self,
        devices: tuple[int, ...],
        seen_at: float,
        moved_at: float,
        active_s: float = 0.0,
        watched_s: float = 0.0,
        busy: float | None = None,
        memory: int = 0,
    ) -> None:
        self.devices = devices
        self.seen_at = seen_at  # first sample where it had a GPU client whose use can be read
        self.moved_at = moved_at
        self.active_s = active_s
        self.watched_s = watched_s
        self.busy = busy
        self.memory = memory


class Observation(Record):
    __slots__ = ("at", "devices", "holders", "unreadable", "errors", "nvml")

    def __init__(
        self,
        at: float,
        devices: list[DeviceView] | None = None,
        holders: list[Holder] | None = None,
        unreadable: list[int] | None = None,
        errors: list[str] | None = None,
        nvml: str = "absent",
    ) -> None:
        self.at = at
        self.devices: list[DeviceView] = [] if devices is None else devices
        self.holders: list[Holder] = [] if holders is None else holders
        # pids whose open files this runner cannot read
        self.unreadable: list[int] = [] if unreadable is None else unreadable
        self.errors: list[str] = [] if errors is None else errors
        self.nvml = nvml

    def blocking(self) -> list[Holder]:
        return [h for h in self.holders if h.who == "foreign" and h.uses]

    def idle(self) -> list[Holder]:
        """Holders that do not hold the lane: ignored ones, and foreign ones not using the GPU."""
        return [h for h in self.holders if h.who == "ignored" or (h.who == "foreign" and not h.uses)]


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
