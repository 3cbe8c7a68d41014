"""status.json as a screen a person reads at a glance (shared by `runner status` and `plan status`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runner.durations import format_duration
from runner.procs import brief_command
from runner.readers import stopped_words, terminal_safe
from runner.views.waiting import WaitGroup, cut_middle, every_waiter, group_waiting, waiter
from runner.vocab import Reason

# Reasons whose blocker is a job the runner runs
_ON_A_RUN = frozenset({Reason.LANE_BUSY.value, Reason.EXCLUSIVE.value})
DETAIL_WIDTH = 90  # a REQUIRES or command longer than this is cut in the middle: the file name at its end survives


def render_status(
    status: dict[str, Any], now: float, every: bool = False, estimates: dict[str, Any] | None = None
) -> str:
    """The screen: who serves the queue, each lane, then the waiting jobs grouped by reason and blocker with the
    oldest few of each (EVERY: one line per waiting job); ESTIMATES (runner.estimates' answer) add when running jobs
    end and the next queued ones start."""
    lines = _header(status, now)
    counts = status.get("counts", {})
    lines.append("jobs: " + "  ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append("")
    ends = (estimates or {}).get("running") or {}
    lines.extend(_lanes(status, now, ends if isinstance(ends, dict) else {}))
    lines.extend(gpu_lines(status.get("gpus") or {}, now))
    queued = status.get("queued", [])
    groups = _groups(status.get("waiting_groups"), now) if not every else None
    count = status.get("waiting_count") if groups is not None else len(queued)
    if count:
        lines.append("")
        lines.append(f"waiting ({count}{_judged(count, counts.get('queue'))}):")
        found = (estimates or {}).get("queued")
        starts = found if isinstance(found, dict) else {}
        lines.extend(_every(queued, now, starts) if every else _grouped(queued, now, groups, _ended_blockers(status)))
        known = [] if every else _starts(queued, starts, now)
        if known:
            lines.append("")
            lines.extend(known)
    return terminal_safe("\n".join(lines))  # last lines and details are job output: no escapes reach a terminal


def _judged(waiting: Any, queue: Any) -> str:
    """Where the waiting jobs (as the runner last judged them, each with its reason) are not the jobs in queue/ now
    (the `jobs:` line: files put there since, or gone, that its next sweep judges), what each counts."""
    if not isinstance(waiting, int) or not isinstance(queue, int) or waiting == queue:
        return ""
    return f" as the runner last judged them; {queue} in queue/ now"


def runner_down(status: dict[str, Any], stopped: Any, queued: Any) -> str:
    """The first line of a queue whose runner is not running: STOPPED (cleanly: when and why, from
    runner.readers.runner_stopped's STOPPED, and what that leaves of QUEUED jobs) or DEAD (it ended without a
    runner-stop: killed, crashed)."""
    pid = (status.get("runner") or {}).get("pid")
    said = stopped_words(stopped)
    if said is None:
        return f"DEAD: runner pid {pid} is not running (it ended without a runner-stop: killed or crashed)"
    if not isinstance(queued, int) or queued <= 0:
        return f"STOPPED: runner pid {pid} {said}; nothing is queued"
    jobs = f"{queued} job{'s' * (queued != 1)}"
    return f"STOPPED: runner pid {pid} {said}; {jobs} queued, none starts until a runner runs"


def _every(queued: list[dict[str, Any]], now: float, starts: dict[str, Any]) -> list[str]:
    """`--all`: a line per waiting job, with its estimated start where there is one."""
    lines = []
    for reason, w in every_waiter(queued, now):
        line = f"  {reason:<11} {format_duration(now - w.since):>7}  {w.job}  {cut_middle(w.detail, DETAIL_WIDTH)}"
        at = (starts.get(w.job) or {}).get("starts") if isinstance(starts.get(w.job), dict) else None
        if isinstance(at, (int, float)):
            line += f"  (est. start ~{_clock(at, now)})"
        lines.append(line)
    return lines


def _groups(found: Any, now: float) -> list[WaitGroup] | None:
    """The groups the host agent made (`waiting_groups`: it sends those, not every waiting job), as group_waiting
    makes them; None where the answer has none (a whole list, or an older agent)."""
    if not isinstance(found, list):
        return None
    groups = []
    for group in found:
        if not isinstance(group, dict) or not isinstance(group.get("count"), int):
            return None
        oldest = tuple(waiter(w, now) for w in group.get("oldest") or [] if isinstance(w, dict))
        groups.append(
            WaitGroup(str(group.get("reason") or "?"), str(group.get("blocker") or ""), group["count"], oldest)
        )
    return groups


def _ended_blockers(status: dict[str, Any]) -> Callable[[WaitGroup], bool]:
    """Whether a group waits on a running job that runs no more: a job's end judges its lane's next jobs at once
    and the rest at the runner's next sweep (up to --tick later), so until then their reason names it as running."""
    runner = status.get("runner") if isinstance(status.get("runner"), dict) else {}
    if (runner or {}).get("backend") == "slurm" or not isinstance(status.get("running"), list):
        return lambda group: False
    running = {run.get("job") for run in status["running"] if isinstance(run, dict)}
    return lambda group: group.reason in _ON_A_RUN and bool(group.blocker) and group.blocker not in running


def _grouped(
    queued: list[dict[str, Any]],
    now: float,
    groups: list[WaitGroup] | None = None,
    ended: Callable[[WaitGroup], bool] = lambda group: False,
) -> list[str]:
    """`requires    259 jobs  oldest 84c-gpu-strata-qwen-q2_0.job 1h07m: test -f …/strata-qwen-q2_0.json`, then
    the next oldest under it; a group of one job is that job's line. GROUPS: made already (by the host agent)."""
    lines = []
    hidden = 0
    for group in group_waiting(queued, now) if groups is None else groups:
        behind = f"  on {cut_middle(group.blocker, 50)}" if group.blocker and group.count > 1 else ""
        jobs = f"{group.count} job{'s' * (group.count != 1)}"
        for i, w in enumerate(group.oldest):
            same = w.detail == group.blocker or (i > 0 and w.detail == group.oldest[0].detail)
            said = "" if same and group.count > 1 else f": {cut_middle(w.detail, DETAIL_WIDTH)}"
            if i == 0 and ended(group):
                said = f": {cut_middle(group.blocker, 50)} has ended since (judged again at the runner's next sweep)"
            waited = f"{w.job} {format_duration(now - w.since)}{said}"
            if i == 0:
                lines.append(f"  {group.reason:<11} {jobs:>9}{behind}  {'oldest ' if group.count > 1 else ''}{waited}")
            else:
                lines.append(f"  {'':<11} {'':>9}{' ' * len(behind)}         {waited}")
        hidden += group.count - len(group.oldest)
    if hidden:
        lines.append(f"  ({hidden} more waiting: --all lists every job)")
    return lines


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
        if runner.get("started_by"):
            lines.append(f"started: {runner['started_by']}")
        views = [v for v in (status.get("lanes") or {}).values() if isinstance(v, dict)]
        if not views or any(v.get("state") != "stopped" for v in views):  # a stopped runner sweeps no more
            lines.extend(_reasons_age(status, now))
    if status.get("parked"):
        lines.append(f"PARKED: {status['parked']}")
    lanes = status.get("parked_lanes")
    if isinstance(lanes, dict):
        lines.extend(f"PARKED LANE {lane}: {why}" for lane, why in sorted(lanes.items()))
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


def _reasons_age(status: dict[str, Any], now: float) -> list[str]:
    """How old the waiting jobs' reasons are, where a sweep pass over them spans several ticks (a large queue:
    runner --sweep-budget) and the last whole pass began more than a tick and a half ago."""
    swept, tick = status.get("swept"), (status.get("runner") or {}).get("tick_s")
    if not isinstance(swept, (int, float)) or not isinstance(tick, (int, float)) or now - swept <= 1.5 * tick:
        return []
    line = f"reasons as of {format_duration(now - swept)} ago (a sweep over every waiting job spans several ticks"
    sweep = status.get("sweep")
    began, judged = (sweep.get("began"), sweep.get("judged")) if isinstance(sweep, dict) else (None, None)
    if isinstance(began, (int, float)) and isinstance(judged, int) and began > swept:
        line += f"; this one has judged {judged} since {format_duration(max(0.0, now - began))} ago"
    return [line + ")"]


def _estimate(word: str, at: Any, basis: Any, now: float) -> str:
    """`est. end ~17:55, in 1h55m (estimate: BASIS)`, or why there is none."""
    if not isinstance(at, (int, float)):
        return f"est. {word} unknown: {basis}"
    return f"est. {word} ~{_clock(at, now)}, in {format_duration(max(0.0, at - now))} (estimate: {basis})"


def _clock(at: float, now: float) -> str:
    return time.strftime("%H:%M" if abs(at - now) < 20 * 3600 else "%b %d %H:%M", time.localtime(at))


def _starts(queued: list[dict[str, Any]], starts: dict[str, Any], now: float, per_lane: int = 1) -> list[str]:
    """The next queued job of each lane that has an estimated start, in the order the runner takes them."""
    lines = ["estimated starts (the next of each lane):"]
    shown: dict[str, int] = {}
    for item in sorted(queued, key=lambda q: (str(q.get("lane")), q["job"])):
        estimate = starts.get(item["job"])
        lane = item.get("lane")
        if not isinstance(lane, str):
            continue  # a file not yet a job (settling, invalid): it has no lane to start in
        if not isinstance(estimate, dict) or estimate.get("starts") is None or shown.get(lane, 0) >= per_lane:
            continue  # a job no clock tells the start of (blocked, a REQUIRES made outside the plan) is not listed
        shown[lane] = shown.get(lane, 0) + 1
        text = _estimate("start", estimate.get("starts"), estimate.get("basis"), now)
        lines.append(f"  {lane:<5} {item['job']}  {text}"[:200])
    return lines if len(lines) > 1 else []


def _lanes(status: dict[str, Any], now: float, ends: dict[str, Any]) -> list[str]:
    lanes = status.get("lanes", {})
    running: dict[str, list[dict[str, Any]]] = {}
    for run in status.get("running", []):
        running.setdefault(run["lane"], []).append(run)
    order = status.get("lane_order") or sorted(lanes)
    lines = []
    for lane in [*order, *(name for name in sorted(lanes) if name not in order)]:
        view, runs = lanes.get(lane, {}), running.get(lane, [])
        why = ""
        if view.get("reason") and not runs:  # never `(parked: )`: a blocker is shown only when there is one
            blocker = cut_middle(str(view.get("blocker") or ""), DETAIL_WIDTH)
            why = f" ({view['reason']}: {blocker})" if blocker else f" ({view['reason']})"
        slots = view.get("slots") or 1
        if slots > 1:  # a lane of several slots: how many are in use, then each job in one
            lines.append(f"  {lane:<5} {len(runs)}/{slots} slots busy{why}")
        elif not runs:
            lines.append(f"  {lane:<5} {view.get('state', '?')}{why}")
        for run in runs:
            lines.extend(_running(lane, run, now, ends.get(run["job"])))
    return lines


def gpu_lines(gpus: dict[str, Any], now: float) -> list[str]:
    """Each GPU: busy, memory, whose; the holders that do not hold the lane (idle GPU holders); what failed.
    What a box wrote is read as it may be: an entry of the wrong shape is left out, never a traceback."""
    devices = [d for d in _list(gpus.get("devices")) if isinstance(d, dict)]
    holders = [h for h in _list(gpus.get("holders")) if isinstance(h, dict)]
    errors = [str(e) for e in _list(gpus.get("errors"))]
    if not devices and not holders and not errors:
        return []
    seen = gpus.get("seen")
    age = format_duration(max(0.0, now - float(seen))) if isinstance(seen, (int, float)) else "?"
    lines = ["", f"gpus (seen {age} ago):"]
    by_pid = {h.get("pid"): h for h in holders}

    def named(pids: object) -> str:
        return ", ".join(f"{p} {_program(by_pid.get(p, {}).get('cmd'))}" for p in _list(pids)[:4])

    for d in devices:
        busy = f"{d['busy_pct']}%" if isinstance(d.get("busy_pct"), int) else "?"
        line = (
            f"  gpu {d.get('gpu')}  {d.get('pci', '')} {d.get('driver', '')}  busy {busy}  mem {_size(d.get('memory'))}"
        )
        for who in ("ours", "foreign", "ignored"):
            if _list(d.get(who)):
                line += f"  {who}: " + (", ".join(map(str, _list(d[who]))) if who == "ours" else named(d[who]))
        lines.append(line)
    for h in holders:
        if h.get("who") == "foreign" and h.get("uses") is True:
            lines.append(f"  using the GPU: pid {h.get('pid')} {brief_command(str(h.get('cmd')), 60)} ({h.get('why')})")
    idle = [h for h in holders if h.get("who") == "ignored" or (h.get("who") == "foreign" and h.get("uses") is False)]
    if idle:
        said = "; ".join(
            f"pid {h.get('pid')} {brief_command(str(h.get('cmd')), 40)} ({h.get('why')})" for h in idle[:8]
        )
        lines.append(f"  idle GPU holders: {said}")
    lines.extend(f"  cannot read: {e}" for e in errors)
    return lines


def _program(cmd: object) -> str:
    """A command line's program, by its base name."""
    return str(cmd or "?").split(" ")[0].rsplit("/", 1)[-1][:30]


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _running(lane: str, run: dict[str, Any], now: float, estimate: Any = None) -> list[str]:
    grew = format_duration(now - float(run.get("log_grew_at") or now))
    on = f"  gpu {','.join(map(str, run['gpus']))}" if run.get("gpus") else ""
    if run.get("slurm_id") is not None:  # on Slurm: which Slurm job (an array's element as ARRAY_N) it is
        on += f"  slurm {run['slurm_id']}"
    # its age at NOW from when it started: status.json's elapsed_s is as old as the tick that wrote it (up to --tick)
    started = run.get("started")
    elapsed = now - float(started) if isinstance(started, (int, float)) else float(run["elapsed_s"])
    lines = [
        f"  {lane:<5} {run['job']}{on}  {format_duration(max(0.0, elapsed))}  attempt {run['attempt']}  log +{grew} ago"
    ]
    if run.get("progress"):
        lines.append(f"        {run['progress']}")
    if isinstance(estimate, dict) and estimate.get("ends") is not None:
        lines.append(f"        {_estimate('end', estimate.get('ends'), estimate.get('basis'), now)}")
    if run.get("last_line"):
        lines.append(f"        | {run['last_line'][:110]}")
    return lines
