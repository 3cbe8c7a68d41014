"""What is wrong on this box now, one `Cause` per cause (not per job it touches): the incident book's input.

Each judge reads the runner's own tables (reasons, running jobs, state.json's last failures) and returns the
causes it sees; `judge` runs them in order. To add a cause, write a function `(Seen, now) -> list[Cause]` and
put it in JUDGES (before `idle`, which alerts only for waiting that no other cause explains). Waiting that is
the queue's own order is never a cause: `order`, `lane-busy`, `backoff`, `settling`, a REQUIRES on a file an
in-plan job still queued or running will write, a job behind the holder of an exclusive lane (the holder's own
long-running incident names it), and a job whose `EXPECT_WAIT` has not passed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple

from runner import jobfile, logs
from runner.durations import format_duration
from runner.progress import parse_progress
from runner.records import Record

if TYPE_CHECKING:
    from runner.records import Parsed, Reason, Running

NAMES_SHOWN = 3  # a cause's text names this many of its jobs, then "+N"


class Cause(NamedTuple):
    """One thing wrong now. `kind` and `subject` make its id; `jobs` may change without a new alert (but see
    JOINING_IS_NEWS)."""

    kind: str  # a key of CAUSE_KINDS: gpu-held, failed, long-running, disk-full, install-stuck, ...
    subject: str  # what it is about: "pid 1234", a failure's signature, a job, a path
    text: str  # one line a person reads: what is wrong
    jobs: tuple[str, ...] = ()  # the jobs it touches (they join and leave without a new alert, unless acked)
    look: str = ""  # the one command to look, with HOST where the host's name goes

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.subject}"


# Every kind a cause can have, with the `plan watch` kind it is shown as (and exits with).
CAUSE_KINDS = {
    "gpu-held": "WAITING",
    "failed": "EVENT",
    "long-running": "STALL",
    "gpu-stalled": "STALL",
    "blocked": "BLOCKED",
    "requires": "WAITING",
    "idle": "IDLE",
    "parked": "PARKED",
    "disk-full": "WAITING",
    "install-stuck": "WAITING",
}

# The kinds whose jobs are themselves the trouble (each failed, or can never run): a job that joins one of these
# after its ack is a change, news the ack did not cover, and ends the ack (runner.alerts.book). The other kinds'
# jobs wait on the cause the ack already names: more of them waiting is the same news.
JOINING_IS_NEWS = frozenset({"failed", "blocked"})


class Headers(Mapping[str, "jobfile.JobFile"]):
    """The queued jobs' parsed headers by name, in name order: a view of the scanner's table (not a copy of it,
    which at 100,000 queued was 5 MB for a moment every time the causes were judged)."""

    def __init__(self, queued: list[tuple[str, Parsed]], taken: Mapping[str, Parsed]) -> None:
        self.queued = queued
        self.taken = taken  # QUEUED by name

    def __getitem__(self, filename: str) -> jobfile.JobFile:
        parsed = self.taken[filename]
        if not isinstance(parsed.job, jobfile.JobFile):
            raise KeyError(filename)
        return parsed.job

    def __iter__(self) -> Iterator[str]:
        return (f for f, p in self.queued if isinstance(p.job, jobfile.JobFile))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Seen(Record):
    """What one tick saw, as the judges read it. RUNNER is the service's Runner (runner.service.runner), typed
    loosely: the service imports this package, never the other way round."""

    __slots__ = ("runner", "queued", "headers", "running", "covered")

    def __init__(
        self,
        runner: Any,
        queued: list[tuple[str, Parsed]],
        headers: Mapping[str, jobfile.JobFile] | None = None,
        running: set[str] | None = None,
        covered: set[str] | None = None,
    ) -> None:
        self.runner = runner
        self.queued = queued
        self.headers: Mapping[str, jobfile.JobFile] = {} if headers is None else headers  # queued job -> its header
        self.running: set[str] = set() if running is None else running  # running job files
        # jobs an earlier cause (or an expected wait) explains
        self.covered: set[str] = set() if covered is None else covered

    @classmethod
    def of(cls, runner: Any, queued: list[tuple[str, Parsed]], taken: Mapping[str, Parsed] | None = None) -> Seen:
        """TAKEN: QUEUED by name (the scanner's table); made from QUEUED where not given or not the same jobs."""
        headers = Headers(queued, taken if taken is not None and len(taken) == len(queued) else dict(queued))
        return cls(runner, queued, headers, {r.filename for r in runner.jobs.running.values()})

    def in_flight(self, filename: str) -> bool:
        """FILENAME is queued or running."""
        return filename in self.headers or filename in self.running


def names(jobs: list[str] | tuple[str, ...]) -> str:
    """A few job names, then how many more: `a.job, b.job, c.job +57`."""
    shown = ", ".join(jobs[:NAMES_SHOWN])
    return shown + (f" +{len(jobs) - NAMES_SHOWN}" if len(jobs) > NAMES_SHOWN else "")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def expected_until(job: jobfile.JobFile | None, reason: str) -> float | None:
    """How long JOB says a wait on REASON is normal (its EXPECT_WAIT header), in seconds; None: not said."""
    if job is None:
        return None
    waits = dict(job.expect_wait)
    if reason in waits:
        return waits[reason]
    return waits.get("*")


def _expected(seen: Seen, filename: str, reason: Reason, now: float) -> bool:
    limit = expected_until(seen.headers.get(filename), reason.reason)
    return limit is not None and now - reason.since < limit


def gpu_held(seen: Seen, now: float) -> list[Cause]:
    """A GPU process this runner did not start holds the gpu lane: one cause per holder, with its waiting jobs."""
    holders: dict[Any, list[tuple[str, Reason]]] = {}
    for filename, reason in seen.runner.reasons.items():
        if reason.reason == "gpu-foreign" and not _expected(seen, filename, reason, now):
            holders.setdefault(reason.extra.get("pid"), []).append((filename, reason))
    causes = []
    for pid, waiting in holders.items():
        extra = waiting[0][1].extra
        cmd = str(extra.get("cmd") or "")
        program = os.path.basename(cmd.split()[0]) if cmd.split() else "?"
        left = f", left by {extra['left_by']}" if extra.get("left_by") else ""
        jobs = sorted(f for f, _ in waiting)
        on = f" on GPU {extra['gpu']}" if extra.get("gpu") is not None else ""
        causes.append(
            Cause(
                "gpu-held",
                f"pid {pid}",
                f"gpu lane held by pid {pid} ({program}{left}){on}, not started by this runner: "
                f"{_count(len(jobs), 'job')} wait ({names(jobs)})",
                tuple(jobs),
                "plan status HOST",
            )
        )
        seen.covered.update(jobs)
    return causes


def failed(seen: Seen, now: float) -> list[Cause]:
    """Jobs in failed/ grouped by what their failure said (its signature): 30 jobs failing with `boom-<n>` are
    one cause. A job leaves the cause when it leaves failed/ (`plan retry`, a push); a job blocked behind one of
    them is part of it. Cancelled jobs are not failures."""
    runner = seen.runner
    groups: dict[str, list[tuple[str, str]]] = {}
    failed_dir = runner.queue.dir("failed")
    for job, record in sorted(runner.state.last_failure.items()):
        summary = str(record.get("summary") or "") if isinstance(record, dict) else ""
        if summary.startswith("cancelled by") or not os.path.exists(failed_dir / job):
            continue
        groups.setdefault(logs.signature(summary, job), []).append((job, summary))
    blocked_by: dict[str, list[str]] = {}
    for filename, reason in runner.reasons.items():
        producer = reason.extra.get("producer") if reason.reason == "blocked" else None
        if producer:
            blocked_by.setdefault(str(producer), []).append(filename)
    causes = []
    for signature, members in groups.items():
        jobs = [job for job, _ in members]
        behind = sorted(f for job in jobs for f in blocked_by.get(job, []))
        seen.covered.update(behind)
        if len(jobs) == 1:
            text = f"{jobs[0]} failed: {members[0][1][:200]}"
        else:
            text = f"{len(jobs)} jobs failed with `{signature[:160]}` ({names(jobs)})"
        if behind:
            text += f"; {_count(len(behind), 'job')} can never run behind them ({names(behind)})"
        look = f"plan logs HOST {jobs[0]}"
        causes.append(Cause("failed", signature[:200], text, tuple(jobs + behind), look))
    return causes


def long_running(seen: Seen, now: float) -> list[Cause]:
    """A running job past its WARN_AFTER (or its lane's default), or whose log has been silent for --stall:
    one cause per job, naming the jobs that wait behind it (an exclusive lane's, a full lane's)."""
    runner, cfg = seen.runner, seen.runner.config
    behind: dict[str, list[str]] = {}
    for filename, reason in runner.reasons.items():
        if reason.reason in ("exclusive", "lane-busy") and reason.blocker:
            behind.setdefault(reason.blocker, []).append(filename)
    causes = []
    for run in runner.jobs.running.values():
        warn = run.job.warn_after_s or cfg.warn_after.get(run.lane)
        elapsed = now - run.started
        silent = now - run.log_grew_at if run.log_grew_at else 0.0
        slow = bool(warn) and elapsed >= float(warn or 0)
        stalled = silent >= cfg.stall_s
        if not (slow or stalled):
            continue
        waiting = sorted(behind.get(run.filename, []))
        seen.covered.update(waiting)
        text = f"{run.filename} running {format_duration(elapsed)} in lane {run.lane}"
        if stalled:
            text += f", log silent for {format_duration(silent)}"
        text += _progress(seen, run)
        if waiting:
            text += f"; {_count(len(waiting), 'job')} wait behind it ({names(waiting)})"
        causes.append(
            Cause("long-running", run.filename, text, (run.filename, *waiting), f"plan logs HOST {run.filename}")
        )
    return causes


def gpu_stalled(seen: Seen, now: float) -> list[Cause]:
    """A running gpu job whose GPU engine time has not moved for --gpu-stall while it runs (a wedged server
    sitting on the GPU, its log as quiet as a long computation's): one cause per job."""
    limit = seen.runner.config.gpu_stall_s
    causes = []
    for run in seen.runner.jobs.running.values():
        if limit <= 0 or run.gpu_still_s < limit:
            continue
        on = f" on GPU {','.join(map(str, run.gpus))}" if run.gpus else ""
        text = (
            f"{run.filename} runs{on} but its GPU engine time has not moved for "
            f"{format_duration(run.gpu_still_s)} (a wedged server?)"
        )
        causes.append(Cause("gpu-stalled", run.filename, text, (run.filename,), f"plan logs HOST {run.filename}"))
    return causes


def _progress(seen: Seen, run: Running) -> str:
    shown = parse_progress("\n".join(logs.tail_lines(seen.runner.queue.log_path(run.filename), 20)))
    return f" ({shown})" if shown else ""


def blocked(seen: Seen, now: float) -> list[Cause]:
    """A REQUIRES that can never hold because no job of any plan here produces its path (or its producer is not
    on this host): one cause per path. A producer that failed is the failure's cause, not a new one."""
    paths: dict[str, list[tuple[str, Reason]]] = {}
    for filename, reason in seen.runner.reasons.items():
        if reason.reason != "blocked" or _expected(seen, filename, reason, now):
            continue
        producer = reason.extra.get("producer")
        if producer and os.path.exists(seen.runner.queue.dir("failed") / str(producer)):
            continue  # the failure's own incident names it
        paths.setdefault(str(reason.extra.get("path") or reason.blocker), []).append((filename, reason))
    causes = []
    for path, waiting in sorted(paths.items()):
        jobs = sorted(f for f, _ in waiting)
        seen.covered.update(jobs)
        causes.append(
            Cause(
                "blocked",
                path,
                f"{_count(len(jobs), 'job')} can never run: {waiting[0][1].detail[:200]} ({names(jobs)})",
                tuple(jobs),
                "plan status HOST",
            )
        )
    return causes


def requires(seen: Seen, now: float) -> list[Cause]:
    """A REQUIRES false for longer than --requires-warn (or the job's EXPECT_WAIT), on something no queued or
    running job of the plans here will make: one cause per condition, with every job waiting on it."""
    runner = seen.runner
    manifest = runner.manifest.get() or {}
    entries = manifest.get("jobs") or {}
    producers = manifest.get("producers") or {}
    conditions: dict[str, list[tuple[str, Reason]]] = {}
    for filename, reason in runner.reasons.items():
        if reason.reason != "requires":
            continue
        entry = entries.get(filename) if isinstance(entries, dict) else None
        made = [p for path in (entry or {}).get("requires", []) for p in producers.get(path, [])]
        if any(seen.in_flight(p) for p in made):
            seen.covered.add(filename)  # the queue's order: its producer is queued or running
            continue
        limit = expected_until(seen.headers.get(filename), "requires")
        if limit is None:
            limit = runner.config.requires_warn_s
        if now - reason.since < limit:
            if expected_until(seen.headers.get(filename), "requires") is not None:
                seen.covered.add(filename)
            continue
        conditions.setdefault(reason.detail, []).append((filename, reason))
    causes = []
    for condition, waiting in sorted(conditions.items()):
        jobs = sorted(f for f, _ in waiting)
        seen.covered.update(jobs)
        longest = now - min(r.since for _, r in waiting)
        causes.append(
            Cause(
                "requires",
                condition[:200],
                f"{_count(len(jobs), 'job')} waited {format_duration(longest)} on REQUIRES {condition[:160]} "
                f"and no job here will make it ({names(jobs)})",
                tuple(jobs),
                "plan status HOST",
            )
        )
    return causes


def parked(seen: Seen, now: float) -> list[Cause]:
    why = seen.runner.controls.park
    if not why:
        return []
    seen.covered.update(seen.headers)
    return [Cause("parked", "queue", f"the queue is parked: {why[:200]}", (), "plan unpark HOST")]


def disk_full(seen: Seen, now: float) -> list[Cause]:
    full = seen.runner.jobs.disk_full
    if not full:
        return []
    return [Cause("disk-full", "disk", f"jobs cannot start: {str(full)[:200]}", (), "plan status HOST")]


def install_stuck(seen: Seen, now: float) -> list[Cause]:
    """A push's install is pending and cannot be finished (runner.service.pending): no job starts anywhere."""
    why = seen.runner.pending.stuck
    if not why:
        return []
    seen.covered.update(seen.headers)  # every waiting job waits on it first
    return [
        Cause(
            "install-stuck",
            "install",
            f"no job starts: a push's install cannot be finished ({why[:200]}); the runner tries it again every tick",
            (),
            "plan status HOST",
        )
    ]


def idle(seen: Seen, now: float) -> list[Cause]:
    """Nothing running for --idle while a queued job waits on something no other cause explains. Counted from
    when the queue last had work it could not start (a fresh push starts the count), never for settling files."""
    runner = seen.runner
    since = runner.announcer.idle_since
    if runner.jobs.running or since is None or now - since < runner.config.idle_s:
        return []
    unexplained = []
    for filename in seen.headers:
        reason = runner.reasons.get(filename)
        if filename in seen.covered or reason is None or reason.reason in ("settling", "backoff", "held"):
            continue
        if _expected(seen, filename, reason, now):
            continue
        unexplained.append((filename, reason))
    if not unexplained:
        return []
    jobs = [f for f, _ in unexplained]
    first = unexplained[0][1]
    return [
        Cause(
            "idle",
            "queue",
            f"nothing running for {format_duration(now - since)} while {_count(len(jobs), 'job')} wait "
            f"({names(jobs)}; first: {first.reason} {first.detail[:120]})",
            tuple(jobs),
            "plan status HOST",
        )
    ]


JUDGES = (gpu_held, failed, long_running, gpu_stalled, blocked, requires, parked, disk_full, install_stuck, idle)


def judge(
    runner: Any, queued: list[tuple[str, Parsed]], now: float, taken: Mapping[str, Parsed] | None = None
) -> list[Cause]:
    """Every cause true on this box now, in JUDGES' order. TAKEN: QUEUED by name, where the caller has it."""
    seen = Seen.of(runner, queued, taken)
    causes: list[Cause] = []
    for one in JUDGES:
        causes.extend(one(seen, now))
    return causes
