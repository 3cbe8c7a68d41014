"""What a report says: spans per lane, each job's runs, silences, the runner's liveness; as text or JSON."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plancompiler.report.events import format_ts
from runner.durations import format_duration
from runner.files import read_json
from runner.readers import runner_alive, runner_stopped, status_problem, stopped_words, terminal_safe


def _again(stats: JobStats) -> str:
    """` (1 retry, 2 reruns)`: a job's attempts that were retries after a failure, apart from its reruns."""
    parts = [f"{n} {word}{'s' * (n != 1)}" for n, word in ((stats.retries, "retry"), (stats.reruns, "rerun")) if n]
    return f" ({', '.join(parts)})".replace("retrys", "retries") if parts else ""


@dataclass
class Span:
    lane: str
    start: float
    end: float
    state: str  # busy, idle, waiting, down
    job: str = ""
    cause: str = ""
    inferred: bool = False
    slots_busy: int = 1  # a busy lane of several slots: how many were in use (its lane event's `busy`)
    holder: str = ""  # waiting: what held the lane (the holder job, the foreign pid, the missing file)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class JobStats:
    attempts: int = 0
    retries: int = 0  # attempts the runner made again after a failure (RETRIES)
    reruns: int = 0  # runs after the job had ended (a push that changed it, `plan retry`)
    outcome: str = ""
    busy_s: float = 0.0
    durations: list[float] = field(default_factory=list)
    lane: str = ""
    gpu_active_s: float = 0.0  # of its runs' time watched on the GPU, how long the GPU was seen working for it
    gpu_watched_s: float = 0.0
    cpu_s: float | None = None  # CPU seconds of its attempts' process trees, summed (None: no end said it)
    peak_rss_mb: float | None = None  # the largest peak memory of its attempts
    waited: dict[str, float] = field(default_factory=dict)  # on Slurm: its attempts' waits by Slurm's reason

    def add_waited(self, event: dict[str, Any]) -> None:
        """Add an attempt's wait by Slurm's reason, as its start (or end, if it never ran) says it."""
        found = event.get("waited")
        for reason, seconds in found.items() if isinstance(found, dict) else ():
            value = _number(seconds)
            if isinstance(reason, str) and value is not None and value >= 0:
                self.waited[reason] = round(self.waited.get(reason, 0.0) + value, 3)

    def account(self, event: dict[str, Any]) -> None:
        """Add what an attempt used, as its end event says (runner.service.accounting)."""
        cpu, peak = _number(event.get("cpu_s")), _number(event.get("peak_rss_mb"))
        if cpu is not None:
            self.cpu_s = round((self.cpu_s or 0.0) + cpu, 2)
        if peak is not None:
            self.peak_rss_mb = max(self.peak_rss_mb or 0.0, peak)

    def usage_text(self) -> str:
        parts = [f"cpu {format_duration(self.cpu_s)}"] if self.cpu_s is not None else []
        parts += [f"peak {megabytes(self.peak_rss_mb)}"] if self.peak_rss_mb is not None else []
        return "  ".join(parts)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def megabytes(value: float) -> str:
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"


def _job_json(stats: JobStats) -> dict[str, Any]:
    """A job's figures; its GPU time only where the runner watched it on the GPU, its CPU and peak memory only
    where an end event said them (seed-format events do not)."""
    found = asdict(stats)
    if not stats.gpu_watched_s:
        del found["gpu_active_s"], found["gpu_watched_s"]
    if not stats.waited:
        del found["waited"]
    return {k: v for k, v in found.items() if v is not None or k not in ("cpu_s", "peak_rss_mb")}


@dataclass
class Report:
    start: float
    end: float
    spans: list[Span]
    jobs: dict[str, JobStats]
    clusters: list[dict[str, Any]]
    silences: list[tuple[float, float]]
    inferred: bool
    lanes: list[str]
    skipped: list[str] = field(default_factory=list)  # malformed events left out, each with where it was
    notes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        for lane in self.lanes:
            row: dict[str, Any] = {
                "busy_s": 0.0,
                "idle_s": 0.0,
                "waiting_s": 0.0,
                "down_s": 0.0,
                "causes": {},
                "slot_s": 0.0,
            }
            for span in self.spans:
                if span.lane != lane:
                    continue
                row[f"{span.state}_s"] = row.get(f"{span.state}_s", 0.0) + span.seconds
                if span.state == "busy":  # busy: at least one slot in use; slot_s: each slot's busy time summed
                    row["slot_s"] += span.seconds * span.slots_busy
                if span.state == "waiting":
                    row["causes"][span.cause] = row["causes"].get(span.cause, 0.0) + span.seconds
            mine = [stats for stats in self.jobs.values() if stats.lane == lane and stats.gpu_watched_s > 0]
            if mine:  # the runner watched its jobs on the GPU: how much of that the GPU really worked
                row["gpu_active_s"] = sum(stats.gpu_active_s for stats in mine)
                row["gpu_watched_s"] = sum(stats.gpu_watched_s for stats in mine)
            row.update(self._usage(lane))
            waited: dict[str, float] = {}
            for stats in self.jobs.values():
                for reason, seconds in stats.waited.items() if stats.lane == lane else ():
                    waited[reason] = round(waited.get(reason, 0.0) + seconds, 3)
            if waited:  # on Slurm: how long its jobs waited, by Slurm's reason (each job's own wait, summed)
                row["waited"] = waited
            result[lane] = row
        return result

    def _usage(self, lane: str) -> dict[str, float | None]:
        """The lane's jobs' CPU seconds summed and their largest peak memory (None where no end said them)."""
        mine = [s for s in self.jobs.values() if s.lane == lane]
        cpu = [s.cpu_s for s in mine if s.cpu_s is not None]
        peak = [s.peak_rss_mb for s in mine if s.peak_rss_mb is not None]
        return {"cpu_s": round(sum(cpu), 2) if cpu else None, "peak_rss_mb": max(peak) if peak else None}

    def to_json(self) -> dict[str, Any]:
        return {
            "start": format_ts(self.start),
            "end": format_ts(self.end),
            "inferred": self.inferred,
            "lanes": self.totals(),
            "spans": [asdict(s) | {"seconds": s.seconds} for s in self.spans],
            "jobs": {name: _job_json(stats) for name, stats in sorted(self.jobs.items())},
            "failure_clusters": self.clusters,
            "silences": [{"from": format_ts(a), "to": format_ts(b), "seconds": b - a} for a, b in self.silences],
            "skipped": self.skipped,
            "notes": self.notes,
        }

    def text(self) -> str:
        """The report for a terminal: names and lines from the events are made safe to print."""
        return terminal_safe(self._text())

    def _text(self) -> str:
        # Event times are naive local times (as the runner writes them): across a DST change, say which.
        zone = time.localtime(self.start).tm_isdst != time.localtime(self.end).tm_isdst
        span = f"{format_ts(self.start, zone)} .. {format_ts(self.end, zone)}"
        out = [f"report {span} ({format_duration(self.end - self.start)})"]
        out += self.notes
        if self.skipped:
            out.append(
                f"skipped {len(self.skipped)} malformed event{'s' * (len(self.skipped) != 1)}: "
                + "; ".join(self.skipped[:5])
                + ("; ..." if len(self.skipped) > 5 else "")
            )
        if self.inferred:
            out.append("(seed-format events: no `lane` records; lane states are inferred from start/end events)")
        out.append("")
        out.append(f"{'lane':<6} {'busy':>8} {'idle':>8} {'waiting':>8} {'down':>8}")
        totals = self.totals()
        for lane, row in totals.items():
            out.append(
                f"{lane:<6} {format_duration(row['busy_s']):>8} {format_duration(row['idle_s']):>8} "
                f"{format_duration(row['waiting_s']):>8} {format_duration(row['down_s']):>8}"
            )
            if row["cpu_s"] is not None or row["peak_rss_mb"] is not None:
                used = JobStats(cpu_s=row["cpu_s"], peak_rss_mb=row["peak_rss_mb"]).usage_text()
                out.append(f"         jobs used {used} (cpu summed, the largest peak)")
            if row["slot_s"] > row["busy_s"]:  # a lane of several slots ran jobs side by side
                out.append(f"         slot-time busy {format_duration(row['slot_s']):>7} (jobs side by side)")
            if row.get("gpu_watched_s"):
                share = round(100 * row["gpu_active_s"] / row["gpu_watched_s"])
                out.append(
                    f"         GPU really busy {format_duration(row['gpu_active_s']):>7} of "
                    f"{format_duration(row['gpu_watched_s'])} its jobs ran on it ({share}%)"
                )
            if row.get("waited"):
                longest = sorted(row["waited"].items(), key=lambda kv: -kv[1])
                said = ", ".join(f"{reason} {format_duration(seconds)}" for reason, seconds in longest)
                out.append(f"         its jobs waited (Slurm's reasons, summed): {said}")
            for cause, seconds in sorted(row["causes"].items(), key=lambda kv: -kv[1]):
                tag = " (inferred)" if self.inferred else ""
                out.append(f"         idle with work waiting {format_duration(seconds):>7}: {cause}{tag}")
        out.append("")
        out.append("jobs:")
        width = max((len(j) for j in self.jobs), default=4)
        for name, stats in sorted(self.jobs.items()):
            took = ", ".join(format_duration(d) for d in stats.durations)
            out.append(
                f"  {name:<{width}}  {stats.lane:<4} {stats.attempts} attempt{'s' * (stats.attempts != 1)}"
                f"{_again(stats)}  {stats.outcome or 'unfinished':<10} {took}"
                + (f"  {stats.usage_text()}" if stats.usage_text() else "")
            )
        if self.clusters:
            out.append("")
            out.append("failure clusters:")
            for cluster in self.clusters:
                names = ", ".join(cluster["jobs"])
                out.append(f"  {len(cluster['jobs'])} jobs failed with: {cluster['line']}  ({names})")
        if self.silences:
            out.append("")
            out.append("longest silences (no event but the runner's heartbeat):")
            for a, b in self.silences:
                out.append(f"  {format_duration(b - a):>8}  {format_ts(a, zone)} .. {format_ts(b, zone)}")
        return "\n".join(out)


@dataclass(frozen=True)
class Liveness:
    """What is known of the runner now, beyond its events: the window then runs to NOW, and a runner that is
    not ALIVE has been down since its last sign of life (its last event, or HEARTBEAT if later)."""

    now: float
    alive: bool
    heartbeat: float | None = None
    stopped: str | None = None  # how a runner that stopped cleanly stopped (runner.readers.stopped_words)


def liveness(answer: dict[str, Any]) -> Liveness | None:
    """From a host's status answer (or a local root's status.json read the same way)."""
    now, status = answer.get("now"), answer.get("status")
    if not isinstance(now, (int, float)) or not isinstance(status, dict):
        return None
    runner: dict[str, Any] = status["runner"] if isinstance(status.get("runner"), dict) else {}
    beat = runner.get("heartbeat")
    return Liveness(
        float(now),
        bool(answer.get("runner_alive")),
        float(beat) if isinstance(beat, (int, float)) and not isinstance(beat, bool) else None,
        stopped_words(answer.get("runner_stopped")),
    )


def file_liveness(path: Path) -> Liveness | None:
    """For a queue root's own events.jsonl: its status.json next to it, read as a host's status answer is."""
    if path.name != "events.jsonl":
        return None
    try:
        status = read_json(path.parent / "status.json")
    except (OSError, ValueError):
        return None
    if status is None or status_problem(status):
        return None
    alive = runner_alive(status)
    stopped = None if alive else runner_stopped(str(path.parent), status)
    return liveness({"now": time.time(), "status": status, "runner_alive": alive, "runner_stopped": stopped})
