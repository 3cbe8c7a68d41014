"""Estimates: when each running job ends and when each queued job starts, each with the basis it rests on.

A running job ends when its parsed progress says (its own ETA, else the share done so far), else after the
median of its earlier done runs (runner/history.py), else of its family's. A queued job starts when a slot of its
lane frees (its running jobs' ends, then the jobs before it in the lane's order, each taking its expected
length), and not before the jobs it requires (manifest.json's `after`) or the lane's exclusive holder end. The
model is the runner's own order without back-filling: an estimate, labelled as one everywhere it is shown.
Computed by the host agent on request from status.json, history.json and manifest.json; standard library only.
"""

from __future__ import annotations

import re
from typing import Any

from runner.durations import format_duration
from runner.estimates.history import History

# At most this many queued jobs per lane get an estimate in the answer (the screens show the first few).
PER_LANE = 50
_PCT = re.compile(r"^\s*(\d{1,3}(?:\.\d+)?)%")
_CLOCK = re.compile(r"ETA\s+(\d+(?::\d{1,2}){1,2})\s*$")
_UNITS = re.compile(r"ETA\s+((?:\d+\s*[dhms]\s*)+)$")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# Reasons no estimate can be made for: nothing in the queue says when they end.
_NEVER = {
    "blocked": "it can never run (blocked)",
    "parked": "the queue is parked",
    "disk-full": "the disk is full",
    "gpu-foreign": "a GPU process the runner did not start holds the lane",
    "settling": "its file is still being written",
    "held": "it is held: `plan release` lets it start",
}


def progress_left(progress: str, elapsed: float) -> tuple[float, str] | None:
    """Seconds left by a parsed progress line (runner/progress.py's words), and the basis; None if it says none."""
    clock = _CLOCK.search(progress)
    if clock:
        parts = [int(p) for p in clock.group(1).split(":")]
        seconds = 0
        for part in parts:
            seconds = seconds * 60 + part
        return float(seconds), "its progress line's ETA"
    units = _UNITS.search(progress)
    if units:
        total = sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+)\s*([dhms])", units.group(1)))
        return float(total), "its progress line's ETA"
    pct = _PCT.match(progress)
    if pct:
        done = float(pct.group(1))
        if 0 < done < 100 and elapsed > 0:
            return elapsed * (100 - done) / done, f"{done:g}% done in {format_duration(elapsed)}"
    return None


def estimate(
    status: dict[str, Any],
    history: History,
    jobs: dict[str, Any],
    now: float,
    per_lane: int = PER_LANE,
    down: str | None = None,
) -> dict[str, Any]:
    """{"running": {job: {ends, left_s, basis}}, "queued": {job: {starts, in_s, basis}}} from STATUS (status.json),
    HISTORY and JOBS (manifest.json's jobs: each one's `family` and `after`). An unknown time is None, with why.
    DOWN: why no runner runs the queue (stopped, dead): then no queued job has a start."""
    ends: dict[str, float | None] = {}
    beat = _dict(status.get("runner")).get("heartbeat")
    running_out: dict[str, Any] = {}
    free: dict[str, list[tuple[float | None, str]]] = {}  # lane -> each slot: when it frees (None: unknown), by what
    lanes = _dict(status.get("lanes"))
    for run in status.get("running") or []:
        if not isinstance(run, dict) or not isinstance(run.get("job"), str):
            continue
        job, lane = run["job"], str(run.get("lane"))
        elapsed = _elapsed(run, beat)
        left = _running_left(run, history, _family(jobs, job), elapsed)
        if left is None:
            ends[job] = None
            running_out[job] = {"ends": None, "left_s": None, "basis": "no progress line and no earlier run"}
        else:
            seconds, basis = left
            ends[job] = now + seconds
            running_out[job] = {"ends": round(now + seconds, 1), "left_s": round(seconds, 1), "basis": basis}
        free.setdefault(lane, []).append((ends[job], job))
    for lane, view in lanes.items():
        slots = view.get("slots") if isinstance(view, dict) else None
        slots = slots if isinstance(slots, int) and slots >= 1 else 1
        taken = free.setdefault(lane, [])
        taken.extend([(now, "")] * max(0, slots - len(taken)))
    queued_out: dict[str, Any] = {}
    shown: dict[str, int] = {}
    for item in status.get("queued") or []:
        if not isinstance(item, dict) or not isinstance(item.get("job"), str):
            continue
        job, lane = item["job"], str(item.get("lane"))
        if shown.get(lane, 0) >= per_lane:
            ends[job] = None
            continue
        shown[lane] = shown.get(lane, 0) + 1
        if down is not None:
            start, basis = None, down
        else:
            start, basis = _start(item, jobs, ends, free.setdefault(lane, [(now, "")]), now)
        if start is None:
            ends[job] = None
            queued_out[job] = {"starts": None, "in_s": None, "basis": basis}
            continue
        length = history.expected(job, _family(jobs, job))
        ends[job] = start + length[0] if length else None
        _take_slot(free[lane], start, ends[job], job)
        queued_out[job] = {
            "starts": round(start, 1),
            "in_s": round(start - now, 1),
            "basis": basis
            + (f"; runs ~{format_duration(length[0])} ({length[1]})" if length else "; its length is unknown"),
        }
    return {"running": running_out, "queued": queued_out}


def _elapsed(run: dict[str, Any], beat: Any) -> float:
    """How long RUN had run when its progress was read: at `progress_at` where the agent read its log now, else at
    the runner's last heartbeat (the box's clock either way), else as status.json last said."""
    started = run.get("started")
    at = run.get("progress_at", beat)
    if isinstance(at, (int, float)) and isinstance(started, (int, float)):
        return max(0.0, float(at) - float(started))
    elapsed = run.get("elapsed_s")
    return float(elapsed) if isinstance(elapsed, (int, float)) else 0.0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _family(jobs: dict[str, Any], job: str) -> str | None:
    spec = jobs.get(job)
    family = spec.get("family") if isinstance(spec, dict) else None
    return family if isinstance(family, str) else None


def _running_left(
    run: dict[str, Any], history: History, family: str | None, elapsed: float
) -> tuple[float, str] | None:
    progress = run.get("progress")
    if isinstance(progress, str) and progress:
        found = progress_left(progress, elapsed)
        if found:
            return found
    length = history.expected(run["job"], family)
    if length is None:
        return None
    if elapsed > length[0]:
        return 0.0, f"past its expected {format_duration(length[0])} ({length[1]})"
    return length[0] - elapsed, length[1]


def _start(
    item: dict[str, Any],
    jobs: dict[str, Any],
    ends: dict[str, float | None],
    slots: list[tuple[float | None, str]],
    now: float,
) -> tuple[float | None, str]:
    """When ITEM can start and why: not before what it waits for, and when the first slot of its lane frees."""
    reason = str(item.get("reason", ""))
    if reason in _NEVER:
        return None, _NEVER[reason]
    earliest, why = now, ""
    if reason == "requires":
        spec = jobs.get(item["job"])
        after = spec.get("after") if isinstance(spec, dict) else None
        if not after:
            return None, "its REQUIRES is made outside the plan"
        pending = [p for p in after if p in ends]  # the others are done (or not in this queue)
        unknown = [p for p in pending if ends[p] is None]
        if unknown:
            return None, f"after {unknown[0]}, whose end is unknown"
        if pending:
            last = max(pending, key=lambda p: ends[p] or 0.0)
            earliest, why = max(earliest, ends[last] or now), f"after {last} ends"
    elif reason == "exclusive" and item.get("blocker") in ends:
        holder = str(item["blocker"])
        if ends[holder] is None:
            return None, f"after {holder} (exclusive lane), whose end is unknown"
        earliest, why = max(earliest, ends[holder] or now), f"after {holder} (exclusive lane) ends"
    known = [(at, by) for at, by in slots if at is not None]
    if not known:
        return None, f"after {slots[0][1] or 'the running job'}, whose end is unknown" if slots else "no slot"
    at, by = min(known)
    if at > earliest:
        earliest, why = at, f"when {by} ends" if by else why
    return earliest, why or "now: a slot is free"


def _take_slot(slots: list[tuple[float | None, str]], start: float, end: float | None, job: str) -> None:
    """The slot that frees first (at or before START) is this job's from START to END."""
    known = [i for i, (at, _) in enumerate(slots) if at is not None and at <= start]
    index = min(known, key=lambda i: slots[i][0] or 0.0) if known else 0
    slots[index] = (end, job)


def _read(status: dict[str, Any], per_lane: int = PER_LANE) -> list[str]:
    """The jobs whose manifest entries `estimate` reads: those running, and each lane's first PER_LANE queued."""
    jobs = [run.get("job") for run in status.get("running") or [] if isinstance(run, dict)]
    shown: dict[str, int] = {}
    for item in status.get("queued") or []:
        lane = str(item.get("lane")) if isinstance(item, dict) else ""
        if shown.get(lane, 0) < per_lane:
            shown[lane] = shown.get(lane, 0) + 1
            jobs.append(item.get("job"))
    return [job for job in jobs if isinstance(job, str)]


def from_root(root: str, status: dict[str, Any], now: float, down: str | None = None) -> dict[str, Any]:
    """The estimates for the queue at ROOT, whose status.json is STATUS (what the agent answers with). The manifest
    entries they read are in status.json (`estimate_jobs`: a runner writes those of its running jobs and each
    lane's first waiting ones); manifest.json is read whole for an older runner's, or where the whole list is.
    DOWN: why no runner runs there (no queued job starts)."""
    from pathlib import Path

    from runner.files import read_json_or_none

    jobs = status.get("estimate_jobs")
    if not isinstance(jobs, dict) or any(job not in jobs for job in _read(status)):
        manifest = read_json_or_none(str(Path(root) / "manifest.json"))
        jobs = manifest.get("jobs") if isinstance(manifest, dict) else None
    return estimate(status, History.load(Path(root)), jobs if isinstance(jobs, dict) else {}, now, down=down)
