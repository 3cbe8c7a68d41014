"""What the runner's parts share: the attributes Runner.__init__ sets, declared once for the mixins."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner import procs
from runner.config import Config
from runner.queue import Queue
from runner.records import Reason, Running


class RunnerBase:
    """Declarations only: Controls, Reasons and Announcements are mixed into Runner, which sets these."""

    config: Config
    queue: Queue
    root: str
    root_id: str
    state: dict[str, Any]
    running: dict[str, Running]
    exited: dict[int, int]
    reasons: dict[str, Reason]
    lane_state: dict[str, tuple[str, str, str, str]]
    lane_since: dict[str, float]
    announced: dict[tuple[str, str], float]
    failures: list[tuple[float, str, str, str]]
    correlated: dict[str, int]
    idle_since: float | None
    gpu_unknown: list[procs.GpuUser]
    ticks: int
    instance: str
    started_at: float
    _manifest_cache: tuple[tuple[int, int, int], dict[str, Any] | None] | None
    _manifest_tick: int
    _presence_tick: int
    _presence_sets: tuple[set[str], set[str]]
    park: str  # why the queue is parked, read once a tick; '' when it is not
    clock: float  # the `now` of the tick in progress
    first_seen: dict[str, tuple[tuple[int, int, int], float]]
    stuck: dict[str, str]
    settle_due: float | None
    parsed: dict[str, Any]
    kept_leaks: dict[int, str]
    lifetimes: list[Any]
    write_errors: dict[str, str]
    disk_full: str


    # Methods one part calls on another.
    _end_tree: Callable[[Running], list[procs.Proc]]
    _tree: Callable[[Running], list[procs.Proc]]
    reap: Callable[[], None]
    _holds: Callable[[Any], tuple[bool, str]]
    _correlate: Callable[[float, str, list[str]], None]
    _forget: Callable[[str], None]
    _refund: Callable[[str], None]
    _parked: Callable[[float], str]
    corrupt_said: dict[str, set[tuple[str, str]]]
    _leave_running: Callable[[str, str], bool]
    _report_corrupt: Callable[[float, str, list[tuple[str, str]]], None]
    _manifest: Callable[[], dict[str, Any] | None]
    _reason: Callable[..., None]
    _due_global: Callable[[tuple[str, str], float, float], bool]
