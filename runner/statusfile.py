"""status.json, rewritten every tick: what runs, why each queued job waits, each lane, what is wrong."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from runner import FORMAT_VERSION, __version__, logs
from runner.announce import progress
from runner.queue import timestamp, write_json
from runner.records import Parsed

if TYPE_CHECKING:
    from runner.service import Runner


def write_status(runner: Runner, now: float, queued: list[tuple[str, Parsed]]) -> None:
    status = {
        "runner": {
            "pid": os.getpid(),
            "version": __version__,
            "format_version": FORMAT_VERSION,
            "instance": runner.instance,
            "root": runner.root,
            "started": runner.started_at,
            "heartbeat": now,
            "heartbeat_ts": timestamp(now),
            "tick": runner.ticks,
            "tick_s": runner.config.tick_s,
        },
        "lane_order": list(runner.config.lanes),
        "lanes": {
            lane: {
                "state": v.state,
                "job": v.job,
                "reason": v.reason,
                "blocker": v.blocker,
                "since": runner.announcer.lane_since.get(lane),
                "slots": runner.config.slots_of(lane),
                "busy": len(runner.jobs.in_lane(lane)),
            }
            for lane, v in runner.announcer.lane_state.items()
        },
        "running": _running(runner, now),
        "queued": _waiting(runner, queued),
        "parked": runner.controls.park or None,
        "gpu_unknown": {
            "count": len(runner.facts.gpu_unknown),
            "policy": runner.config.unreadable_gpu,
            "processes": [{"pid": u.pid, "cmd": u.cmd[:120]} for u in runner.facts.gpu_unknown[:20]],
        },
        "counts": {s: len(runner.queue.jobs(s)) for s in ("queue", "running", "done", "failed")},
        "disk_full": runner.jobs.disk_full or None,
        "write_errors": {
            **runner.problems.write_errors,
            **({"events.jsonl": runner.queue.events_error} if runner.queue.events_error else {}),
        },
        "leaks": [
            {"pid": pid, "left_by": job}
            for pid, job in sorted(runner.jobs.kept_leaks.items())
            if runner.processes.alive(pid)
        ],
    }
    write_json(runner.queue.status_path, status)


def _running(runner: Runner, now: float) -> list[dict[str, Any]]:
    running = []
    for run in runner.jobs.running.values():
        path = runner.queue.log_path(run.filename)
        running.append(
            {
                "job": run.filename,
                "lane": run.lane,
                "pid": run.pid,
                "attempt": run.attempt,
                "started": run.started,
                "elapsed_s": round(now - run.started, 1),
                "log": str(path),
                "log_size": run.log_size,
                "log_grew_at": run.log_grew_at,
                "timeout_s": run.job.timeout_s,
                "warn_after_s": run.job.warn_after_s or runner.config.warn_after.get(run.lane),
                "last_line": logs.last_line(path),
                "progress": progress(path),
            }
        )
    return running


def _waiting(runner: Runner, queued: list[tuple[str, Parsed]]) -> list[dict[str, Any]]:
    waiting = []
    lanes = {filename: parsed.job.lane for filename, parsed in queued}  # type: ignore[union-attr]
    # Queued jobs with a reason, then files not yet jobs: settling, or invalid and stuck in queue/.
    for filename in [f for f, _ in queued] + sorted(f for f, _ in runner.reasons.items() if f not in lanes):
        reason = runner.reasons.get(filename)
        if reason is None:
            continue
        waiting.append(
            {
                "job": filename,
                "lane": lanes.get(filename),
                "reason": reason.reason,
                "detail": reason.detail,
                "blocker": reason.blocker,
                "since": reason.since,
            }
        )
    return waiting
