"""How a job's run ends: done, retry or failed (as it ended, also while the runner was down)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runner import jobfile, logs, stamps, wrapper
from runner.conditions import Condition, compile_condition
from runner.config import Config
from runner.estimates import History
from runner.queue import Queue, timestamp
from runner.records import Running
from runner.runstate import RunnerState
from runner.service import accounting
from runner.service.announce import Announcer
from runner.service.facts import Facts
from runner.vocab import Event


def leave_running(queue: Queue, filename: str, dst: str) -> bool:
    """Move a job out of running/, then drop its wrapper's exit record (in that order: a kill -9 between
    the two leaves a stray record, never a finished job without one)."""
    moved = queue.move(filename, "running", dst)
    wrapper.clear_record(queue.exit_record(filename))
    return moved


class Outcomes:
    def __init__(self, config: Config, queue: Queue, state: RunnerState, facts: Facts, announcer: Announcer) -> None:
        self.config = config
        self.queue = queue
        self.state = state
        self.facts = facts
        self.announcer = announcer
        self.history = History.load(config.root)  # done runs' lengths, for the estimates (history.json)
        self.history_changed = False

    def finish(self, now: float, run: Running, rc: int, ended: float | None = None) -> None:
        """Record RUN's end: done, retry or failed. ENDED is when it ended, where that was while we were down."""
        done_if = compile_condition(run.job.done_if) if run.job.done_if else None
        verified = self.facts.holds(done_if)[0] if done_if is not None else None
        when: dict[str, Any] = {"duration_s": round((ended or now) - run.started, 1)}
        if ended is not None:
            when.update(ended=timestamp(ended), while_down=True)
        if self.facts.gpu_watch is not None:  # not made: no job was ever watched on a GPU
            self.facts.gpu_watch.forget_job(run.filename)
        if run.gpus:
            when["gpus"] = list(run.gpus)
        if run.gpu_watched_s:  # how much of its run the GPU was seen working for it (`plan report`'s gpu lane)
            when.update(gpu_active_s=round(run.gpu_active_s, 1), gpu_watched_s=round(run.gpu_watched_s, 1))
        when.update(accounting.run_fields(run))
        if rc == 0 and verified is not False and not run.timed_out:
            # Stamped while the file is still in running/: what it ran with, and its producers' runs.
            manifest = self.facts.manifest
            manifest.problems.report(
                now, *stamps.record_done(str(self.config.root), run.filename, run.job, manifest.get(), now)
            )
            self.record_done(now, run.filename, rc, verified, when)
            self._remember(now, run.filename, manifest.get(), when["duration_s"])
            return
        details: dict[str, Any] = {"rc": rc, "attempt": run.attempt, "verified": verified, **when}
        summary = self._failure(now, run, rc, done_if, details)
        lines = logs.meaningful(details["tail"])
        if lines:
            summary += f": {lines[-1][:200]}"
        if run.attempt < run.job.retries:
            delay = self.config.backoff_s(run.attempt)
            self.state.backoff_until[run.filename] = now + delay
            leave_running(self.queue, run.filename, "queue")
            self.queue.emit(
                now,
                run.filename,
                Event.RETRY.value,
                next_attempt=run.attempt + 1,
                retries=run.job.retries,  # attempts allowed: `attempt 2 of 3 in 30s`
                backoff_s=delay,
                **details,
            )
        else:
            leave_running(self.queue, run.filename, "failed")
            self.state.failed(run.filename, timestamp(now), rc, summary)
            self.state.ended(run.filename)
            self.queue.emit(now, run.filename, Event.FAILED.value, **details)
        self.announcer.correlate(now, run.filename, lines)

    def record_done(self, now: float, filename: str, rc: int, verified: bool | None, when: dict[str, Any]) -> None:
        """The one place a run is recorded done."""
        leave_running(self.queue, filename, "done")
        self.queue.emit(now, filename, Event.DONE.value, rc=rc, verified=verified, **when)
        self.state.last_failure.pop(filename, None)
        self.state.ended(filename)

    def _remember(self, now: float, filename: str, graph: dict[str, Any] | None, seconds: float) -> None:
        """A done run's length, for the estimates; history.json is written by the sweep's tick (save_history), not
        between a job's end and its successor's start."""
        spec = ((graph or {}).get("jobs") or {}).get(filename)
        family = spec.get("family") if isinstance(spec, Mapping) else None
        self.history.record(filename, family if isinstance(family, str) else None, seconds, now)
        self.history_changed = True

    def save_history(self, now: float) -> None:
        if self.history_changed:
            self.history_changed = False
            self.facts.manifest.problems.keep(now, "history.json", lambda: self.history.save(self.config.root))

    def _failure(self, now: float, run: Running, rc: int, done_if: Condition | None, details: dict[str, Any]) -> str:
        """Adds why the run failed and its log's tail to DETAILS; returns a one-line summary."""
        tail = logs.tail_lines(self.queue.log_path(run.filename), self.config.tail_lines, run.log_offset)
        if run.timed_out:
            details["why"] = "timeout"
            summary = f"timed out after {int(now - run.started)}s"
        elif rc == 0:
            missing = self._missing_outputs(run.job, done_if)
            details["why"] = "exited 0 but DONE_IF is false"
            details["missing"] = missing
            names = ", ".join(m["path"] for m in missing) or run.job.done_if or ""
            summary = f"exited 0 but DONE_IF is false (missing {names})"
        else:
            summary = f"exited {rc}"
        details["tail"] = tail
        return summary

    def _missing_outputs(self, job: jobfile.JobFile, done_if: Condition | None) -> list[dict[str, Any]]:
        paths = list(job.outputs) or list(done_if.paths() if done_if else ())
        missing = []
        for path in paths:
            full = os.path.join(str(self.config.root), path)
            if not os.path.exists(full) or (os.path.isfile(full) and os.path.getsize(full) == 0):
                missing.append({"path": path, "closest": logs.closest_names(full)})
        return missing

    def finish_recorded(self, now: float, filename: str, record: wrapper.ExitRecord) -> None:
        """A job that ended while the runner was down: recorded done/failed as it ended (DONE_IF checked now)."""
        data = b""
        try:
            data = (self.queue.dir("running") / filename).read_bytes()
        except OSError:
            pass
        job = jobfile.parse(filename, data, self.config.lanes)
        if isinstance(job, jobfile.Invalid):
            job = jobfile.JobFile(name=jobfile.job_name(filename), lane=self.config.lanes[0], body="")
        attempt = max(int(self.state.attempts.get(filename, 0)), 1)
        offset = logs.last_start(self.queue.log_path(filename))
        run = Running(filename, job, 0, job.lane, attempt, record.started, offset, "")
        self.finish(now, run, record.rc, ended=record.ended)
