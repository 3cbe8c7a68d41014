"""The runner's thresholds, in one frozen value with documented defaults (every one is a `runner run` flag)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Config:
    root: Path
    tick_s: float = 10.0
    lanes: tuple[str, ...] = ("net", "gpu", "cpu")  # also the order lanes pick jobs in
    exclusive: tuple[str, ...] = ("net", "gpu")  # at most one of these lanes runs at a time
    gpu_lane: str = "gpu"
    gpu_names: tuple[str, ...] = ("llama-server", "llama-bench", "llama-cli", "flm")
    gpu_devices: tuple[str, ...] = ()  # extra device paths that count as GPU nodes
    # A process whose open files this runner may not read (another user's, when not root) could be
    # using the GPU: "report" lists it in status.json; "block" makes it hold the gpu lane like a foreign user.
    unreadable_gpu: str = "report"
    condition_timeout_s: float = 10.0  # a REQUIRES/DONE_IF run in bash is killed after this
    kill_grace_s: float = 5.0  # TERM, then this long, then KILL
    backoff_base_s: float = 30.0  # retry n waits base * 2**(n-1) ...
    backoff_max_s: float = 600.0  # ... capped here
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
    tail_lines: int = 5
    settle_s: float = 1.0  # a job file written in place is taken once nothing has written to it this long
    keep_leaks: bool = False  # let processes that escaped their job outlive it (daemons on purpose)
    heartbeat_event_s: float = 600.0  # a `heartbeat` event after this long without any other event
    cgroup: str | None = None  # a delegated cgroup v2 directory: one child per job, ended by cgroup.kill
    slots: dict[str, int] = field(default_factory=dict)  # lane -> jobs it runs at once; a lane not named has 1

    def slots_of(self, lane: str) -> int:
        return self.slots.get(lane, 1)

    def backoff_s(self, attempt: int) -> float:
        """The wait before the next try after attempt ATTEMPT (1-based) failed: base * 2**(n-1), capped."""
        return min(self.backoff_base_s * 2 ** (attempt - 1), self.backoff_max_s)
