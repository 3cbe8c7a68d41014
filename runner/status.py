"""status.json as a screen a person reads at a glance (shared by `runner status` and `plan status`)."""
from __future__ import annotations

from typing import Any

from runner.durations import format_duration
from runner.readers import terminal_safe

# Worst first: what can never run, then what waits on something outside the plan.
_REASON_ORDER = ("blocked", "disk-full", "gpu-foreign", "exclusive", "parked", "backoff", "requires", "settling",
                 "lane-busy", "order")


def render_status(status: dict[str, Any], now: float) -> str:
    runner = status.get("runner", {})
    beat = now - float(runner.get("heartbeat", 0) or 0)
    if runner.get("backend") == "slurm":
        lines = [f"Slurm (squeue, read {format_duration(beat)} ago)  submit root {runner.get('root')}"]
    else:
        lines = [f"runner pid {runner.get('pid')} v{runner.get('version')}  heartbeat {format_duration(beat)} ago"
                 f"  tick {runner.get('tick')}  root {runner.get('root')}"]
    if status.get("parked"):
        lines.append(f"PARKED: {status['parked']}")
    if status.get("disk_full"):
        lines.append(f"DISK FULL: {status['disk_full']}")
    for name, why in (status.get("write_errors") or {}).items():
        lines.append(f"CANNOT WRITE {name}: {why}")
    for leak in status.get("leaks") or []:
        lines.append(f"kept leak: pid {leak['pid']} left by {leak['left_by']} (--keep-leaks)")
    unknown = status.get("gpu_unknown") or {}
    if unknown.get("count"):
        lines.append(f"gpu: {unknown['count']} processes whose open files this runner cannot read are unknown "
                     f"GPU users ({'they hold the gpu lane' if unknown.get('policy') == 'block' else 'reported only'})")
    counts = status.get("counts", {})
    lines.append("jobs: " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append("")
    lanes = status.get("lanes", {})
    running = {r["lane"]: r for r in status.get("running", [])}
    order = status.get("lane_order") or sorted(lanes)
    for lane in [*order, *(name for name in sorted(lanes) if name not in order)]:
        view = lanes.get(lane, {})
        run = running.get(lane)
        if run:
            grew = format_duration(now - float(run.get("log_grew_at") or now))
            lines.append(f"  {lane:<5} {run['job']}  {format_duration(run['elapsed_s'])}"
                         f"  attempt {run['attempt']}  log +{grew} ago")
            if run.get("progress"):
                lines.append(f"        {run['progress']}")
            if run.get("last_line"):
                lines.append(f"        | {run['last_line'][:110]}")
        else:
            state = view.get("state", "?")
            why = f" ({view.get('reason')}: {view.get('blocker')})" if view.get("reason") else ""
            lines.append(f"  {lane:<5} {state}{why}")
    queued = status.get("queued", [])
    if queued:
        lines.append("")
        lines.append(f"waiting ({len(queued)}):")
        order = {r: i for i, r in enumerate(_REASON_ORDER)}
        for item in sorted(queued, key=lambda q: (order.get(q["reason"], 99), q.get("since") or 0)):
            since = format_duration(now - float(item.get("since") or now))
            lines.append(f"  {item['reason']:<11} {since:>7}  {item['job']}  {item.get('detail', '')[:90]}")
    return terminal_safe("\n".join(lines))  # last lines and details are job output: no escapes reach a terminal
