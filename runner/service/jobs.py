"""Running jobs: started in their lane, watched for their exit and timeout, ended with everything they left."""

from __future__ import annotations

import errno
import os
from typing import Any

from runner import jobfile, procs, wrapper
from runner.config import Config
from runner.files import open_file
from runner.queue import Queue, timestamp
from runner.records import Running
from runner.runstate import RunnerState
from runner.service import accounting, leaks
from runner.service.announce import Announcer
from runner.service.outcomes import Outcomes, leave_running
from runner.service.proctable import Processes
from runner.service.reasons import Reasons
from runner.vocab import Event
from runner.vocab import Reason as Why


def gpu_env(gpus: tuple[int, ...]) -> dict[str, str]:
    """What tells a job's GPU runtime which GPUs are its own. CUDA numbers GPUs in PCI order only when told
    (CUDA_DEVICE_ORDER), the order this runner numbers them in. ROCm filters by ROCR_VISIBLE_DEVICES first and
    then HIP numbers what is left from 0, so HIP_VISIBLE_DEVICES counts within the job's own GPUs: the same
    physical numbers in both would leave a job on GPU 1 with none (HIP also reads CUDA_VISIBLE_DEVICES, but
    only where HIP_VISIBLE_DEVICES is not set)."""
    physical = ",".join(map(str, gpus))
    return {
        "PLAN_GPU": physical,
        "CUDA_VISIBLE_DEVICES": physical,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "ROCR_VISIBLE_DEVICES": physical,
        "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus))),
    }


class Jobs:
    """Owns `running` (job file -> its run; a lane runs up to its slots), the leaks kept with --keep-leaks and
    the disk-full state."""

    def __init__(
        self,
        config: Config,
        queue: Queue,
        state: RunnerState,
        processes: Processes,
        reasons: Reasons,
        announcer: Announcer,
        outcomes: Outcomes,
        tag_prefix: str,
    ) -> None:
        self.config = config
        self.queue = queue
        self.state = state
        self.processes = processes
        self.reasons = reasons
        self.announcer = announcer
        self.outcomes = outcomes
        self.tag_prefix = tag_prefix  # root id and runner instance: "<root>:<instance>:"
        self.running: dict[str, Running] = {}
        self.kept_leaks: dict[int, str] = {}  # --keep-leaks: pid -> the job that left it
        self.disk_full = ""  # why jobs cannot start, while the disk is full
        self.start_failed_at = 0.0  # when a start last failed: its file moved back must not wake a tick at once

    # -- starting ------------------------------------------------------------------------------
    def start(self, now: float, filename: str, job: jobfile.JobFile, gpus: tuple[int, ...] = ()) -> bool:
        attempt = int(self.state.attempts.get(filename, 0)) + 1
        try:
            moved = self.queue.move(filename, "queue", "running")
        except OSError as exc:
            return self._start_failed(now, filename, exc, moved=False)
        if not moved:
            return False  # removed between the scan and now (a push retiring it, a person): nothing to start
        tag = f"{self.tag_prefix}{filename}"
        cgroup = self.processes.job_cgroup(self.config.cgroup, filename)
        try:
            pid, offset = self._spawn(now, filename, attempt, tag, cgroup, gpus)
        except OSError as exc:
            return self._start_failed(now, filename, exc, moved=True)
        self.state.attempts[filename] = attempt
        self.running[filename] = Running(
            filename,
            job,
            pid,
            job.lane,
            attempt,
            now,
            offset,
            tag,
            log_size=offset,
            log_grew_at=now,
            cgroup=cgroup,
            gpus=gpus,
        )
        self.reasons.drop(filename)
        self.state.backoff_until.pop(filename, None)
        self.announcer.started(filename)
        self.disk_full = ""
        self.queue.emit(
            now,
            filename,
            Event.START.value,
            lane=job.lane,
            pid=pid,
            attempt=attempt,
            **({"gpus": list(gpus)} if gpus else {}),
        )
        return True

    def _spawn(
        self, now: float, filename: str, attempt: int, tag: str, cgroup: str | None, gpus: tuple[int, ...]
    ) -> tuple[int, int]:
        """(pid, where this attempt's output starts in the log)."""
        record = self.queue.exit_record(filename)
        wrapper.clear_record(record)  # one left by an earlier attempt would read as this one's end
        # Never through a symlink planted as logs/JOB.log, and 0600 (or the shared root's 0660) whatever the umask.
        fd = open_file(str(self.queue.log_path(filename)), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"=== {timestamp(now)} start {filename} attempt {attempt} ===\n".encode())
            offset = os.fstat(fd).st_size
            env = dict(os.environ)
            env[procs.TAG_VAR] = tag
            env[procs.JOB_VAR] = filename
            if gpus:
                env.update(gpu_env(gpus))
            # The wrapper joins the job's cgroup before it runs anything (so nothing escapes it), runs the
            # job and records its exit status next to it, which survives a runner killed meanwhile.
            argv = wrapper.argv(
                str(self.queue.dir("running") / filename),
                record,
                os.path.join(cgroup, "cgroup.procs") if cgroup else None,
            )
            return self.processes.spawn(argv, env, str(self.config.root), fd, filename), offset
        finally:
            os.close(fd)

    def _start_failed(self, now: float, filename: str, exc: OSError, moved: bool) -> bool:
        """The job could not be started (ENOSPC writing its log, no fork): back to queue/, no attempt used, said
        once per spell; a full disk shows as `disk-full` in status.json while it lasts, and the queue drains by
        itself once space returns."""
        self.start_failed_at = now
        if moved:
            try:
                leave_running(self.queue, filename, "queue")
            except OSError:
                pass  # left in running/: the next runner start puts it back
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        why = f"{code}: {exc.strerror or exc}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.disk_full = f"{filename} could not start: {why}"
            self.reasons.set(now, filename, Why.DISK_FULL.value, why)
        else:
            self.reasons.set(now, filename, Why.BACKOFF.value, f"could not start ({why}); tried again next tick")
        self.announcer.start_failed(now, filename, code, str(exc.strerror or exc))
        return False

    # -- ending --------------------------------------------------------------------------------
    def end_tree(self, run: Running) -> list[procs.Proc]:
        tree = self.processes.tree(run)
        if tree:
            self.processes.end([p.pid for p in tree])
        if run.cgroup:
            self.processes.end_cgroup(run.cgroup)
        self.processes.reap()
        return tree

    def sample_memory(self) -> None:
        """Each running job's resident memory, summed over its processes, once a tick: its peak is what the end
        event reports where no cgroup counts it (a job in a cgroup with memory.peak is not sampled)."""
        for run in self.running.values():
            if run.cgroup and accounting.cgroup_peak_kb(run.cgroup) is not None:
                continue
            run.peak_kb = max(run.peak_kb, self.processes.tree_rss_kb(run))

    def _account(self, run: Running, cgroup: accounting.CgroupUsage | None) -> None:
        """What RUN used, as it ends: CGROUP read before its cgroup was removed, the usage reaped with its wrapper
        (before the table forgets it)."""
        reaped = self.processes.usage(run.pid)
        run.usage = accounting.end_fields(reaped, run.peak_kb, cgroup)  # GPU time: outcomes adds the GPU watch's

    def end_fields(self, run: Running) -> dict[str, Any]:
        """What an end event of RUN says beyond its outcome (lane, plan, what it used)."""
        return accounting.run_fields(run)

    def evict(self, now: float, run: Running, to: str, why: str, refund: bool) -> list[int]:
        """End RUN's processes and move it out of running/ to TO, without using an attempt when REFUND.
        Back to queue/ it is `recovered` (WHY says by what) unless it had finished by itself just before we
        ended it: that is recorded as it ended, not run again. Returns the pids ended; RUN.usage is what it used."""
        cgroup = accounting.read_cgroup(run.cgroup)  # before end_tree removes it
        tree = self.end_tree(run)
        self._account(run, cgroup)
        self.running.pop(run.filename, None)
        self.processes.forget(run.pid)
        record = wrapper.read_record(self.queue.exit_record(run.filename)) if to == "queue" else None
        if record:
            self.outcomes.finish(now, run, record.rc, ended=record.ended)
            return [p.pid for p in tree]
        leave_running(self.queue, run.filename, to)
        if refund:
            self.state.refund(run.filename)
        if to == "queue":
            self.queue.emit(now, run.filename, Event.RECOVERED.value, why=why)
        return [p.pid for p in tree]

    def enforce_timeouts(self, now: float) -> None:
        for run in list(self.running.values()):
            limit = run.job.timeout_s
            if limit is None or run.timed_out or now - run.started < limit:
                continue
            if self.processes.exit_code(run.pid) is not None:
                continue
            run.timed_out = True
            tree = self.end_tree(run)
            self.queue.emit(
                now,
                run.filename,
                "timeout",
                limit_s=limit,
                elapsed_s=int(now - run.started),
                pids=[p.pid for p in tree],
                attempt=run.attempt,
            )
        self.finish_exited(now)

    def finish_exited(self, now: float) -> None:
        ended = False
        for filename, run in list(self.running.items()):
            rc = self.processes.exit_code(run.pid)
            if rc is None:
                continue
            self._account(run, accounting.read_cgroup(run.cgroup))
            self.processes.forget(run.pid)
            self.running.pop(filename)
            ended = True
            self.processes.job_ended(run.filename)
            self._end_left(now, run)
            recorded = wrapper.read_record(self.queue.exit_record(run.filename))
            if recorded and not run.timed_out:
                rc = recorded.rc  # the job's own status (a wrapper killed by a signal leaves none)
            self.outcomes.finish(now, run, rc)
        if ended:
            self.end_leaks(now)

    def _end_left(self, now: float, run: Running) -> None:
        """What a job that ended left in its session, tag or cgroup ends with it."""
        left = [p for p in self.processes.tree(run) if p.pid != run.pid]
        if left:
            self.processes.end([p.pid for p in left])
            self.queue.emit(
                now,
                run.filename,
                Event.ORPHANS_KILLED.value,
                pids=[p.pid for p in left],
                cmds=[p.cmdline[:200] for p in left],
                cgroup=bool(run.cgroup),
            )
        if run.cgroup:
            self.processes.end_cgroup(run.cgroup)

    def end_leaks(self, now: float) -> None:
        """Processes that escaped their job's tag and session came back to us, the subreaper: they end with
        their job (TERM, grace, KILL), named against it by start time; `--keep-leaks` lets them live."""
        found = self.processes.leaks({run.pid for run in self.running.values()})
        self.kept_leaks = {pid: leak.job for leak in found for pid in leak.group}
        if not found or self.config.keep_leaks:
            return
        self.processes.end(list(self.kept_leaks))
        self.kept_leaks = {}
        for job in sorted({leak.job for leak in found}):
            self._leaks_ended(now, job, [leak for leak in found if leak.job == job])

    def _leaks_ended(self, now: float, job: str, mine: list[leaks.Leak]) -> None:
        why = (
            "escaped its job's tag and session"
            if job != "-"
            else "left by a job (its start time does not name one job)"
        )
        self.queue.emit(
            now,
            job,
            Event.ORPHANS_KILLED.value,
            why=why,
            pids=[pid for leak in mine for pid in leak.group],
            cmds=[leak.cmd[:200] for leak in mine],
        )

    def in_lane(self, lane: str) -> list[Running]:
        return [run for run in self.running.values() if run.lane == lane]

    def left_by(self, user: procs.GpuUser) -> str | None:
        """The job a GPU user escaped from, where it is ours after all."""
        left_by = self.kept_leaks.get(user.pid)
        if left_by is None and user.ppid == os.getpid():
            left_by = self.processes.leak_owner(user.pid)
        return left_by
