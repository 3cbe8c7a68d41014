"""How a job's run ends: done, retry or failed (as it ended, also while the runner was down); what it left behind."""
from __future__ import annotations

import os
from typing import Any

from runner import jobfile, leaks, logs, procs, wrapper
from runner.base import RunnerBase
from runner.conditions import Condition, compile_condition
from runner.queue import timestamp
from runner.records import Running
from runner.vocab import Event


class Outcomes(RunnerBase):
    """Mixed into Runner: reaped jobs are finished here, leaks ended, records of ends while down read."""

    def _finish_exited(self, now: float) -> None:
        ended = False
        for lane, run in list(self.running.items()):
            if run.pid not in self.exited:
                continue
            rc = self.exited.pop(run.pid)
            self.running.pop(lane)
            ended = True
            for life in self.lifetimes:
                if life.job == run.filename and life.end is None:
                    life.end = leaks.now_ticks()
            left = [p for p in self._tree(run) if p.pid != run.pid]
            if left:
                procs.end_processes([p.pid for p in left], self.config.kill_grace_s, self.reap)
                self.queue.emit(now, run.filename, Event.ORPHANS_KILLED.value, pids=[p.pid for p in left],
                                cmds=[p.cmdline[:200] for p in left], cgroup=bool(run.cgroup))
            if run.cgroup:
                procs.cgroup_kill(run.cgroup, 5.0, self.reap)
            recorded = wrapper.read_record(self.queue.exit_record(run.filename))
            if recorded and not run.timed_out:
                rc = recorded.rc  # the job's own status (a wrapper killed by a signal leaves none)
            self._finish(now, run, rc)
        if ended:
            self._end_leaks(now)

    def _end_leaks(self, now: float) -> None:
        """Processes that escaped their job's tag and session came back to us, the subreaper: they end with
        their job (TERM, grace, KILL), named against it by start time; `--keep-leaks` lets them live."""
        found = leaks.find(self.lifetimes, {run.pid for run in self.running.values()})
        self.kept_leaks = {pid: leak.job for leak in found for pid in leak.group}
        if not found or self.config.keep_leaks:
            return
        procs.end_processes([pid for leak in found for pid in leak.group], self.config.kill_grace_s, self.reap)
        self.kept_leaks = {}
        for job in sorted({leak.job for leak in found}):
            mine = [leak for leak in found if leak.job == job]
            why = ("escaped its job's tag and session" if job != "-"
                   else "left by a job (its start time does not name one job)")
            self.queue.emit(now, job, Event.ORPHANS_KILLED.value, why=why,
                            pids=[pid for leak in mine for pid in leak.group], cmds=[leak.cmd[:200] for leak in mine])

    def _finish(self, now: float, run: Running, rc: int, ended: float | None = None) -> None:
        """Record RUN's end: done, retry or failed. ENDED is when it ended, where that was while we were down."""
        filename, job = run.filename, run.job
        parsed_done = compile_condition(job.done_if) if job.done_if else None
        verified: bool | None = None
        if parsed_done is not None:
            verified, _ = self._holds(parsed_done)
        when: dict[str, Any] = {"duration_s": round((ended or now) - run.started, 1)}
        if ended is not None:
            when.update(ended=timestamp(ended), while_down=True)
        if rc == 0 and verified is not False and not run.timed_out:
            self._leave_running(filename, "done")
            self.queue.emit(now, filename, Event.DONE.value, rc=rc, verified=verified, **when)
            self.state["last_failure"].pop(filename, None)
            return
        details: dict[str, Any] = {"rc": rc, "attempt": run.attempt, "verified": verified, **when}
        tail = logs.tail_lines(self.queue.log_path(filename), self.config.tail_lines, run.log_offset)
        if run.timed_out:
            details["why"] = "timeout"
            summary = f"timed out after {int(now - run.started)}s"
        elif rc == 0:
            missing = self._missing_outputs(job, parsed_done)
            details["why"] = "exited 0 but DONE_IF is false"
            details["missing"] = missing
            names = ", ".join(m["path"] for m in missing) or job.done_if or ""
            summary = f"exited 0 but DONE_IF is false (missing {names})"
        else:
            summary = f"exited {rc}"
        lines = logs.meaningful(tail)
        if lines:
            summary += f": {lines[-1][:200]}"
        details["tail"] = tail
        if run.attempt < job.retries:
            delay = self.config.backoff_s(run.attempt)
            self.state["backoff_until"][filename] = now + delay
            self._leave_running(filename, "queue")
            self.queue.emit(now, filename, Event.RETRY.value, next_attempt=run.attempt + 1, backoff_s=delay, **details)
        else:
            self._leave_running(filename, "failed")
            self.state["last_failure"][filename] = {"ts": timestamp(now), "rc": rc, "summary": summary}
            self.queue.emit(now, filename, Event.FAILED.value, **details)
        self._correlate(now, filename, lines)

    def _missing_outputs(self, job: jobfile.JobFile, done_if: Condition | None) -> list[dict[str, Any]]:
        paths = list(job.outputs) or list(done_if.paths() if done_if else ())
        missing = []
        for path in paths:
            full = os.path.join(self.root, path)
            if not os.path.exists(full) or (os.path.isfile(full) and os.path.getsize(full) == 0):
                missing.append({"path": path, "closest": logs.closest_names(full)})
        return missing

    def _finish_recorded(self, now: float, filename: str, record: wrapper.ExitRecord) -> None:
        """A job that ended while the runner was down: recorded done/failed as it ended (DONE_IF checked now)."""
        data = b""
        try:
            data = (self.queue.dir("running") / filename).read_bytes()
        except OSError:
            pass
        job = jobfile.parse(filename, data, self.config.lanes)
        if isinstance(job, jobfile.Invalid):
            job = jobfile.JobFile(name=jobfile.job_name(filename), lane=self.config.lanes[0], body="")
        attempt = max(int(self.state["attempts"].get(filename, 0)), 1)
        offset = logs.last_start(self.queue.log_path(filename))
        run = Running(filename, job, 0, job.lane, attempt, record.started, offset, "")
        self._finish(now, run, record.rc, ended=record.ended)

    def _leave_running(self, filename: str, dst: str) -> bool:
        """Move a job out of running/, then drop its wrapper's exit record (in that order: a kill -9 between
        the two leaves a stray record, never a finished job without one)."""
        moved = self.queue.move(filename, "running", dst)
        wrapper.clear_record(self.queue.exit_record(filename))
        return moved

