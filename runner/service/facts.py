"""Everything the scheduler needs to know, found out (conditions run, manifest read, /proc scanned) once a tick."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Tuple

from runner import jobfile, procs
from runner.conditions import Condition, compile_condition, evaluate, failed_test, stat_flags
from runner.config import Config
from runner.records import Parsed, Running
from runner.runstate import RunnerState
from runner.service.manifest import Manifest
from runner.service.proctable import Processes
from runner.service.schedule import JobFacts, Snapshot
from runner.stamps import stamp_name
from runner.stamps.judge import Verdicts

if TYPE_CHECKING:
    from runner.service.gpu import GpuWatch, Observation

Blocked = Tuple[str, str, str]  # (path, producer, why) of a REQUIRES path that can never appear


class Looking:
    """One tick's look at queued jobs, one job at a time (`facts_of`): each path stat()ed once however many
    jobs' conditions name it (one job's DONE_IF is often the next one's REQUIRES), the manifest read once."""

    def __init__(self, facts: Facts, state: RunnerState, now: float) -> None:
        self.facts = facts
        self.seen: dict[str, int] = {}
        facts.seen = self.seen  # a running job's DONE_IF judged meanwhile shares them too
        self.backoff = state.backoff_until
        self.manifest = facts.manifest.get()
        self.now = now

    def holds(self, cond: Condition) -> bool:  # the fast path inlined: at 10 000 queued jobs this was most of a tick
        checks = cond.checks
        if checks is None:  # bash decides (bounded): `holds` runs it
            return self.facts.holds(cond)[0]
        seen = self.seen
        for index in range(0, len(checks), 2):
            path: str = checks[index + 1]  # type: ignore[assignment]  # (bit, path, bit, path, ...)
            flags = seen.get(path)
            if flags is None:
                flags = seen[path] = stat_flags(path)
                self.facts.stats += 1
            if not flags & checks[index]:  # type: ignore[operator]
                return False
        return True

    def facts_of(self, filename: str, parsed: Parsed) -> JobFacts:
        """What is true of queued FILENAME now: its DONE_IF, its stamp, its REQUIRES (not in backoff)."""
        self.facts.looked_at += 1
        job: jobfile.JobFile = parsed.job  # type: ignore[assignment]  # the scan returns only valid jobs
        done = parsed.done_if is not None and self.holds(parsed.done_if)  # as done_holds, stat()s shared
        stale = None
        if job.plan and job.outputs:  # stamps.stamped(job)
            done, stale = self.facts._stamped(filename, parsed, self.manifest, self.now, done)
        requires: bool | None = None
        if not done and stale is None and (not self.backoff or self.backoff.get(filename, 0) <= self.now):
            requires = parsed.requires is None or self.holds(parsed.requires)
        return JobFacts(filename, job.lane, done, requires, stale, job.gpus, job.priority)

    def end(self) -> None:
        self.facts.seen = None
        self.seen = {}  # a path each job's conditions name: let go at the look's end, not when the caller is done


class Facts:
    def __init__(self, config: Config, root_id: str, manifest: Manifest, processes: Processes) -> None:
        self.config = config
        self.root_id = root_id  # the tag prefix of this root's jobs
        self.root = str(config.root)
        self.manifest = manifest
        self.processes = processes
        self.gpu_unknown: list[procs.GpuUser] = []  # status.json: processes whose open files we cannot read
        self.gpu_watch: GpuWatch | None = None  # made at the first look at the GPUs (`gpus`)
        self.gpu_seen: Observation | None = None  # the last look at the GPUs (status.json shows it)
        # stat_flags of the paths of fast conditions, kept only while a snapshot is taken (a job's DONE_IF
        # judged when it ends must see what it wrote).
        self.seen: dict[str, int] | None = None
        self.verdicts = Verdicts(self.root)  # stamped jobs' verdicts, judged again only when what they read changed
        # Counters for --metrics (and the tests that prove a job's end looks at its lanes' next jobs alone):
        self.looked_at = 0  # queued jobs whose facts (DONE_IF, stamp, REQUIRES) were found out
        self.stats = 0  # stat() calls made for conditions' paths

    def holds(self, cond: Condition | None) -> tuple[bool, str]:
        if cond is None:
            return True, ""
        if not cond.fast:
            outcome = evaluate(cond, self.root, self.config.condition_timeout_s)
            return outcome.holds, outcome.detail
        if cond.checks is None:  # compiled without the root (a running job's DONE_IF, judged as it ends)
            cond = compile_condition(cond.text, self.root)
        false = self._first_false(cond.checks)  # type: ignore[arg-type]
        return (True, "") if false < 0 else (False, failed_test(cond, false))

    def _first_false(self, checks: tuple[int | str, ...]) -> int:
        """The index of the first test of CHECKS (bit, path, ...) that is false, -1 when all hold: each path
        stat()ed once per snapshot (one job's DONE_IF is often the next one's REQUIRES)."""
        seen = self.seen
        for index in range(len(checks) // 2):
            bit: int = checks[2 * index]  # type: ignore[assignment]
            path: str = checks[2 * index + 1]  # type: ignore[assignment]
            if seen is None:
                found = stat_flags(path)
                self.stats += 1
            else:
                found = seen.get(path)  # type: ignore[assignment]
                if found is None:
                    found = seen[path] = stat_flags(path)
                    self.stats += 1
            if not found & bit:
                return index
        return -1

    def done_holds(self, filename: str, parsed: Parsed) -> bool:
        """A queued job's DONE_IF holds already: it is skipped, never run (the one place this is decided)."""
        return parsed.done_if is not None and self.holds(parsed.done_if)[0]

    def begin(self, state: RunnerState, now: float) -> Looking:
        """A tick's look at the queued jobs starts: stat()s shared by its jobs, the manifest read once."""
        self.verdicts.begin(self.manifest.key(), time.time())
        return Looking(self, state, now)

    def build(
        self,
        facts: list[JobFacts],
        running: dict[str, Running],
        parked: str,
        now: float,
        parked_lanes: dict[str, str],
        unseen: frozenset[str] = frozenset(),
    ) -> Snapshot:
        """The snapshot of FACTS (every queued job's, or the first of each lane where UNSEEN names the lane)."""
        lanes: dict[str, tuple[str, ...]] = {}
        taken: dict[int, str] = {}
        for run in running.values():
            lanes[run.lane] = (*lanes.get(run.lane, ()), run.filename)
            taken.update((device, run.filename) for device in run.gpus)
        gpu = self.config.gpu_lane
        gpus = tuple(self.config.gpus)
        free = len(taken) < len(gpus) if gpus else len(lanes.get(gpu, ())) < self.config.slots_of(gpu)
        look = not parked and gpu not in parked_lanes and free and any(f.lane == gpu and f.requires for f in facts)
        return Snapshot(
            tuple(facts),
            lanes,
            self.config.lanes,
            self.config.exclusive,
            gpu,
            parked,
            tuple(self.gpu_users(now, running)) if look else None,
            dict(self.config.slots),  # a copy: the runner updates its own in place when the manifest changes
            gpus,
            taken,
            dict(parked_lanes),
            unseen,
        )

    def _stamped(
        self, filename: str, parsed: Parsed, manifest: dict[str, Any] | None, now: float, done: bool
    ) -> tuple[bool, tuple[str, str] | None]:
        """Rerun on change: DONE_IF counts only while the job's stamp matches what it runs and its producers'
        runs; a stale job runs again, or first waits for a producer that runs again (then: (why, blocker))."""
        job: jobfile.JobFile = parsed.job  # type: ignore[assignment]
        verdict = self.verdicts.judge(filename, parsed.key, job, manifest, now, done)
        said = self.manifest.problems.said
        if verdict.problems or (said and stamp_name(filename) in said):
            self.manifest.problems.report(now, stamp_name(filename), verdict.problems)
        stale = (verdict.why, verdict.blocker) if verdict.stale and verdict.wait else None
        return done and not verdict.stale, stale

    @property
    def gpus(self) -> GpuWatch:
        """The look at the GPUs, made when first needed: a runner whose gpu lane never has work loads neither the
        watch nor the GPU reader (runner.service.gpu, gpuread: ~4 % of a runner's imports)."""
        if self.gpu_watch is None:
            from runner.service.gpu import GpuRules, GpuWatch, Roots

            config = self.config
            roots = Roots(config.gpu_proc, config.gpu_sys, config.gpu_dev)
            rules = GpuRules(
                config.gpu_names,
                config.gpu_ignore,
                config.gpu_window_s,
                config.gpu_memory_bytes,
                config.gpu_devices,
                roots,
            )
            self.gpu_watch = GpuWatch(rules)
        return self.gpu_watch

    def observe_gpus(self, now: float, running: dict[str, Running], max_age: float = 0.0) -> Observation:
        """Who holds each GPU and whether they use it, looked at when the gpu lane has work: before a start always
        (a GPU user may have begun a moment ago), for its running jobs' engine time at most every MAX_AGE."""
        last = self.gpu_seen
        if last is not None and 0 <= now - last.at < max_age:
            return last
        prefix = self.root_id + ":"

        def owner(proc: procs.Proc) -> str | None:
            """The job a process of ours belongs to ("" where that is not known); None: not ours."""
            if proc.tag and proc.tag.startswith(prefix):
                return proc.tag.rsplit(":", 1)[-1] if proc.tag.count(":") >= 2 else ""
            for run in running.values():
                if run.cgroup and proc.pid in self.processes.cgroup_pids(run.cgroup):
                    return run.filename
            return None

        self.gpu_seen = self.processes.gpu_holders(self.gpus, now, owner)
        return self.gpu_seen

    def gpu_users(self, now: float, running: dict[str, Running]) -> list[procs.GpuUser]:
        """The foreign users that hold the gpu lane (each naming the GPUs it holds)."""
        seen = self.observe_gpus(now, running)
        users = [holder.user() for holder in seen.blocking()]
        self.gpu_unknown = []
        for pid in seen.unreadable:
            proc = self.processes.read_proc(pid)
            if proc is not None:
                self.gpu_unknown.append(
                    procs.GpuUser(pid, proc.ppid, proc.cmdline, "unknown: its open files cannot be read by this runner")
                )
        if self.config.unreadable_gpu == "block":
            users = users + self.gpu_unknown
        return users

    def blocked(self, state: RunnerState, filename: str) -> Blocked | None:
        """(path, producer, why) when the manifest shows a REQUIRES path can never appear."""
        manifest = self.manifest.get()
        entry = (manifest or {}).get("jobs", {}).get(filename)
        if not manifest or not entry:
            return None
        external = set(manifest.get("external", []))
        failed, present = self.manifest.presence()
        for path in entry.get("requires", []):
            if os.path.exists(os.path.join(self.root, path)) or path in external:
                continue
            producers = manifest.get("producers", {}).get(path, [])
            if not producers:
                return path, "", f"no job produces {path}"
            if any(p in present for p in producers):
                continue
            producer = producers[0]
            if producer in failed:
                summary = state.last_failure.get(producer, {}).get("summary", "failed")
                return path, producer, f"{path} is produced by {producer}, which failed: {summary}"
            return path, producer, f"{path} is produced by {producer}, which is not on this host"
        return None
