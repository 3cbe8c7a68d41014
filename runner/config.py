"""The runner's thresholds, in one frozen value with documented defaults (every one is a `runner run` flag)."""

from __future__ import annotations

from pathlib import Path

from runner import backoff
from runner.conditions import CONDITION_TIMEOUT_S
from runner.logs import TAIL_LINES
from runner.records import Frozen, fill_all

# Display servers, compositors and GPU monitors: they hold GPU nodes all day long and are never a reason to
# wait (`--gpu-ignore` replaces the list). Names are matched as /proc/PID/comm (15 characters at most) and as
# the base name of argv[0].
GPU_IGNORE = (
    "Xorg",
    "Xwayland",
    "gnome-shell",
    "kwin_wayland",
    "kwin_x11",
    "mutter",
    "sway",
    "weston",
    "Hyprland",
    "labwc",
    "wayfire",
    "cosmic-comp",
    "niri",
    "gamescope",
    "plasmashell",
    "nvtop",
    "amdgpu_top",
    "radeontop",
    "intel_gpu_top",
    "nvidia-smi",
    "nvidia-persistenced",
    "nvidia-persiste",  # its comm, cut to 15 characters
    "nv-hostengine",
    "dcgm-exporter",
    "rocm-smi",
    "amd-smi",
    "nvitop",
    "gpustat",
    "btop",
)


class Config(Frozen):
    """Every `runner run` flag's value (a frozen record: runner.records; made at every runner's start)."""

    root: Path
    tick_s: float
    # The CPU-bound work of one sweep (judging queued jobs' conditions and stamps): a larger queue is judged over
    # several ticks, each reason at most one pass old (status.json's `swept`).
    sweep_budget_s: float
    lanes: tuple[str, ...]  # also the order lanes pick jobs in
    exclusive: tuple[str, ...]  # at most one of these lanes runs at a time
    gpu_lane: str
    gpu_names: tuple[str, ...]
    gpu_devices: tuple[str, ...]  # extra paths that count as GPU nodes: PATH, or N=PATH for GPU N's
    gpu_ignore: tuple[str, ...]  # display servers and GPU monitors: never a reason to wait
    gpu_window_s: float  # a foreign holder's use of the GPU is judged over this long
    gpu_memory_bytes: int  # a foreign holder with this much GPU memory uses it, busy or not
    gpu_stall_s: float  # a gpu job whose GPU engine time has not moved this long is gpu-stalled (0: never)
    gpu_proc: str  # procfs, sysfs and the device directory GPU use is read from (a container
    gpu_sys: str  # reading its host's through bind mounts, or a test's GPU box)
    gpu_dev: str
    # The GPUs the gpu lane gives its jobs, one slot each (--gpus; else the pushed plans' lanes.gpu.devices): a
    # list of our own, kept in place as the manifest changes. Empty: the lane's slots are counted, not GPUs.
    gpus: list[int]
    # A process whose open files this runner may not read (another user's, when not root) could be
    # using the GPU: "report" lists it in status.json; "block" makes it hold the gpu lane like a foreign user.
    unreadable_gpu: str
    condition_timeout_s: float  # a REQUIRES/DONE_IF run in bash is killed after this
    kill_grace_s: float  # TERM, then this long, then KILL
    backoff_base_s: float  # retry n waits base * 2**(n-1) ...
    backoff_max_s: float  # ... capped here
    requires_warn_s: float
    requires_repeat_s: float
    blocked_repeat_s: float
    gpu_wait_repeat_s: float
    idle_s: float
    idle_repeat_s: float
    warn_after: dict[str, float]
    long_running_repeat_s: float
    stall_s: float
    stall_repeat_s: float
    correlate_window_s: float
    correlate_min: int
    tail_lines: int  # a failed job's last log lines, in its event
    settle_s: float  # a job file written in place is taken once nothing has written to it this long
    keep_leaks: bool  # let processes that escaped their job outlive it (daemons on purpose)
    heartbeat_event_s: float  # a `heartbeat` event after this long without any other event
    cgroup: str | None  # a delegated cgroup v2 directory: one child per job, ended by cgroup.kill
    slots: dict[str, int]  # lane -> jobs it runs at once; a lane not named has 1
    # Alerting (runner.alerts.engine): the incident book, --notify and the --ping dead-man's switch.
    host_name: str  # how notices name this box (default: its host name)
    realert_s: float  # an open incident is sent again this often (0: never)
    parked_repeat_s: float  # a parked queue's incident is sent again this often
    notify: tuple[str, ...]  # URLs every notice is sent to
    ping: str | None  # a dead-man's-switch URL, pinged every ping_every_s
    ping_every_s: float
    notify_timeout_s: float  # one delivery's deadline
    metrics_path: Path | None  # a Prometheus text file rewritten every tick (--metrics)

    __slots__ = tuple(__annotations__)

    def __init__(
        self,
        root: Path,
        tick_s: float = 10.0,
        sweep_budget_s: float = 0.1,
        lanes: tuple[str, ...] = ("net", "gpu", "cpu"),
        exclusive: tuple[str, ...] = ("net", "gpu"),
        gpu_lane: str = "gpu",
        gpu_names: tuple[str, ...] = ("llama-server", "llama-bench", "llama-cli", "flm"),
        gpu_devices: tuple[str, ...] = (),
        gpu_ignore: tuple[str, ...] = GPU_IGNORE,
        gpu_window_s: float = 30.0,
        gpu_memory_bytes: int = 1 << 30,
        gpu_stall_s: float = 900.0,
        gpu_proc: str = "/proc",
        gpu_sys: str = "/sys",
        gpu_dev: str = "/dev",
        gpus: list[int] | None = None,
        unreadable_gpu: str = "report",
        condition_timeout_s: float = CONDITION_TIMEOUT_S,
        kill_grace_s: float = 5.0,
        backoff_base_s: float = backoff.BASE_S,
        backoff_max_s: float = backoff.MAX_S,
        requires_warn_s: float = 6 * 3600.0,
        requires_repeat_s: float = 3600.0,
        blocked_repeat_s: float = 3600.0,
        gpu_wait_repeat_s: float = 600.0,
        idle_s: float = 600.0,
        idle_repeat_s: float = 3600.0,
        warn_after: dict[str, float] | None = None,
        long_running_repeat_s: float = 3600.0,
        stall_s: float = 1800.0,
        stall_repeat_s: float = 1800.0,
        correlate_window_s: float = 6 * 3600.0,
        correlate_min: int = 2,
        tail_lines: int = TAIL_LINES,
        settle_s: float = 1.0,
        keep_leaks: bool = False,
        heartbeat_event_s: float = 600.0,
        cgroup: str | None = None,
        slots: dict[str, int] | None = None,
        host_name: str = "",
        realert_s: float = 3600.0,
        parked_repeat_s: float = 7200.0,
        notify: tuple[str, ...] = (),
        ping: str | None = None,
        ping_every_s: float = 300.0,
        notify_timeout_s: float = 10.0,
        metrics_path: Path | None = None,
    ) -> None:
        """Every field by its name, as the dataclass took them (a mutable one left out is a new one of its own)."""
        gpus = [] if gpus is None else gpus
        warn_after = {"net": 3600.0} if warn_after is None else warn_after
        slots = {} if slots is None else slots
        fill_all(self, locals())

    def slots_of(self, lane: str) -> int:
        if lane == self.gpu_lane and self.gpus:
            return len(self.gpus)
        return self.slots.get(lane, 1)

    def backoff_s(self, attempt: int) -> float:
        """The wait before the next try after attempt ATTEMPT (1-based) failed: base * 2**(n-1), capped."""
        return backoff.backoff_s(attempt, self.backoff_base_s, self.backoff_max_s)
