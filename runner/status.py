"""status.json as a screen a person reads at a glance (shared by `runner status` and `plan status`)."""

from __future__ import annotations

from typing import Any

from runner.durations import format_duration
from runner.readers import terminal_safe

# Worst first: what can never run, then what waits on something outside the plan.
_REASON_ORDER = (
    "blocked",
    "disk-full",
    "gpu-foreign",
    "exclusive",
    "parked",
    "backoff",
    "requires",
    "settling",
    "lane-busy",
    "order",
)


def render_status(status: dict[str, Any], now: float) -> str:
    lines = _header(status, now)
    counts = status.get("counts", {})
    lines.append("jobs: " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append("")
    lines.extend(_lanes(status, now))
    queued = status.get("queued", [])
    if queued:
        lines.append("")
        lines.append(f"waiting ({len(queued)}):")
        order = {r: i for i, r in enumerate(_REASON_ORDER)}
        for item in sorted(queued, key=lambda q: (order.get(q["reason"], 99), q.get("since") or 0)):
            since = format_duration(now - float(item.get("since") or now))
            lines.append(f"  {item['reason']:<11} {since:>7}  {item['job']}  {item.get('detail', '')[:90]}")
    return terminal_safe("\n".join(lines))  # last lines and details are job output: no escapes reach a terminal


def _header(status: dict[str, Any], now: float) -> list[str]:
    """Who serves the queue, and whatever is wrong with it as a whole."""
    runner = status.get("runner", {})
    beat = now - float(runner.get("heartbeat", 0) or 0)
    if runner.get("backend") == "slurm":
        lines = [f"Slurm (squeue, read {format_duration(beat)} ago)  submit root {runner.get('root')}"]
    else:
        lines = [
            f"runner pid {runner.get('pid')} v{runner.get('version')}  heartbeat {format_duration(beat)} ago"
            f"  tick {runner.get('tick')}  root {runner.get('root')}"
        ]
    if status.get("parked"):
        lines.append(f"PARKED: {status['parked']}")
    if status.get("disk_full"):
        lines.append(f"DISK FULL: {status['disk_full']}")
    lines.extend(f"CANNOT WRITE {name}: {why}" for name, why in (status.get("write_errors") or {}).items())
    lines.extend(
        f"kept leak: pid {leak['pid']} left by {leak['left_by']} (--keep-leaks)" for leak in status.get("leaks") or []
    )
    unknown = status.get("gpu_unknown") or {}
    if unknown.get("count"):
        lines.append(
            f"gpu: {unknown['count']} processes whose open files this runner cannot read are unknown "
            f"GPU users ({'they hold the gpu lane' if unknown.get('policy') == 'block' else 'reported only'})"
        )
    return lines


def _lanes(status: dict[str, Any], now: float) -> list[str]:
    lanes = status.get("lanes", {})
    running: dict[str, list[dict[str, Any]]] = {}
    for run in status.get("running", []):
        running.setdefault(run["lane"], []).append(run)
    order = status.get("lane_order") or sorted(lanes)
    lines = []
    for lane in [*order, *(name for name in sorted(lanes) if name not in order)]:
        view, runs = lanes.get(lane, {}), running.get(lane, [])
        why = f" ({view.get('reason')}: {view.get('blocker')})" if view.get("reason") and not runs else ""
        slots = view.get("slots") or 1
        if slots > 1:  # a lane of several slots: how many are in use, then each job in one
            lines.append(f"  {lane:<5} {len(runs)}/{slots} slots busy{why}")
        elif not runs:
            lines.append(f"  {lane:<5} {view.get('state', '?')}{why}")
        for run in runs:
            lines.extend(_running(lane, run, now))
    return lines


def _running(lane: str, run: dict[str, Any], now: float) -> list[str]:
    grew = format_duration(now - float(run.get("log_grew_at") or now))
    lines = [
        f"  {lane:<5} {run['job']}  {format_duration(run['elapsed_s'])}  attempt {run['attempt']}  log +{grew} ago"
    ]
    if run.get("progress"):
        lines.append(f"        {run['progress']}")
    if run.get("last_line"):
        lines.append(f"        | {run['last_line'][:110]}")
    return lines
