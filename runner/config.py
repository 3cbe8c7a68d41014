"""The runner's thresholds, in one frozen value with documented defaults (every one is a `runner run` flag)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runner import backoff
from runner.conditions import CONDITION_TIMEOUT_S
from runner.logs import TAIL_LINES

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


@dataclass(frozen=True)
class Config:
    root: Path
    tick_s: float = 10.0
    # The CPU-bound work of one sweep (judging queued jobs' conditions and stamps): a larger queue is judged over
    # several ticks, each reason at most one pass old (status.json's `swept`).
    sweep_budget_s: float = 0.1
    lanes: tuple[str, ...] = ("net", "gpu", "cpu")  # also the order lanes pick jobs in
    exclusive: tuple[str, ...] = ("net", "gpu")  # at most one of these lanes runs at a time
    gpu_lane: str = "gpu"
    gpu_names: tuple[str, ...] = ("llama-server", "llama-bench", "llama-cli", "flm")
    gpu_devices: tuple[str, ...] = ()  # extra paths that count as GPU nodes: PATH, or N=PATH for GPU N's
    gpu_ignore: tuple[str, ...] = GPU_IGNORE  # display servers and GPU monitors: never a reason to wait
    gpu_window_s: float = 30.0  # a foreign holder's use of the GPU is judged over this long
    gpu_memory_bytes: int = 1 << 30  # a foreign holder with this much GPU memory uses it, busy or not
    gpu_stall_s: float = 900.0  # a gpu job whose GPU engine time has not moved this long is gpu-stalled (0: never)
    gpu_proc: str = "/proc"  # procfs, sysfs and the device directory GPU use is read from (a container
    gpu_sys: str = "/sys"  # reading its host's through bind mounts, or a test's GPU box)
    gpu_dev: str = "/dev"
    # The GPUs the gpu lane gives its jobs, one slot each (--gpus; else the pushed plans' lanes.gpu.devices): a
    # list of our own, kept in place as the manifest changes. Empty: the lane's slots are counted, not GPUs.
    gpus: list[int] = field(default_factory=list)
    # A process whose open files this runner may not read (another user's, when not root) could be
    # using the GPU: "report" lists it in status.json; "block" makes it hold the gpu lane like a foreign user.
    unreadable_gpu: str = "report"
    condition_timeout_s: float = CONDITION_TIMEOUT_S  # a REQUIRES/DONE_IF run in bash is killed after this
    kill_grace_s: float = 5.0  # TERM, then this long, then KILL
    backoff_base_s: float = backoff.BASE_S  # retry n waits base * 2**(n-1) ...
    backoff_max_s: float = backoff.MAX_S  # ... capped here
    requires_warn_s: float = 6 * 3600.0
    requires_repeat_s: float = 3600.0
    blocked_repeat_s: float = 3600.0
    gpu_wait_repeat_s: float = 600.0
    idle_s: float = 600.0
    idle_repeat_s: float = 3600.0
    warn_after: dict[str, float] = field(default_factory=lambda: {"net": 3600.0})
    long_running_repeat_s: float = 3600.0
    stall_s: float = 1800.0
    stall_repeat_s: float = 1800.0
    correlate_window_s: float = 6 * 3600.0
    correlate_min: int = 2
    tail_lines: int = TAIL_LINES  # a failed job's last log lines, in its event
    settle_s: float = 1.0  # a job file written in place is taken once nothing has written to it this long
    keep_leaks: bool = False  # let processes that escaped their job outlive it (daemons on purpose)
    heartbeat_event_s: float = 600.0  # a `heartbeat` event after this long without any other event
    cgroup: str | None = None  # a delegated cgroup v2 directory: one child per job, ended by cgroup.kill
    slots: dict[str, int] = field(default_factory=dict)  # lane -> jobs it runs at once; a lane not named has 1
    # Alerting (runner.alerts.engine): the incident book, --notify and the --ping dead-man's switch.
    host_name: str = ""  # how notices name this box (default: its host name)
    realert_s: float = 3600.0  # an open incident is sent again this often (0: never)
    parked_repeat_s: float = 7200.0  # a parked queue's incident is sent again this often
    notify: tuple[str, ...] = ()  # URLs every notice is sent to
    ping: str | None = None  # a dead-man's-switch URL, pinged every ping_every_s
    ping_every_s: float = 300.0
    notify_timeout_s: float = 10.0  # one delivery's deadline
    metrics_path: Path | None = None  # a Prometheus text file rewritten every tick (--metrics)

    def slots_of(self, lane: str) -> int:
        if lane == self.gpu_lane and self.gpus:
            return len(self.gpus)
        return self.slots.get(lane, 1)

    def backoff_s(self, attempt: int) -> float:
        """The wait before the next try after attempt ATTEMPT (1-based) failed: base * 2**(n-1), capped."""
        return backoff.backoff_s(attempt, self.backoff_base_s, self.backoff_max_s)
