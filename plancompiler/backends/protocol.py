"""What push, status, report and the operate commands need from a host, whatever runs its jobs."""

from __future__ import annotations

import getpass
import socket
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plancompiler.errors import Refused as Refused  # its home is plancompiler/errors.py
from plancompiler.hosts import Host

if TYPE_CHECKING:  # status, watch and the operate commands never compile: no pydantic, no jinja2
    from plancompiler.compile import Compiled

# What a push does to each job: new, changed, unchanged, retired, held (failed), retried,
# running (left alone), running but changed (reported, left alone), done (left alone).
MARKS = {
    "+": "new",
    "~": "changed",
    "^": "stale",
    "=": "unchanged",
    "-": "retired",
    "!": "held",
    "r": "retried",
    ">": "running",
    ">~": "running, changed",
    "d": "done",
}
ORDER = ["+", "~", "^", "r", "-", "!", ">~", ">", "=", "d"]


def who() -> str:
    """user@host of this workstation: recorded with pushes, parks and control requests."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return "plan"


@dataclass(frozen=True)
class Change:
    mark: str
    job: str
    state: str | None
    note: str = ""
    cost: int | None = None  # bytes of outputs running it again redoes, where the box can tell
    cost_floor: bool = False  # the box stopped counting a huge tree: at least COST


@dataclass(frozen=True)
class PushOptions:
    dry_run: bool = False
    retry_failed: bool = False
    prune: bool = True
    verify_external: bool = True
    take_over: bool = False
    lock_wait_s: float = 60.0
    dead_s: float = 300.0  # a heartbeat older than this is a dead runner (as `plan watch --dead`)
    expect_runner: bool = True  # False for `plan run`, which starts one itself
    stop_retired: bool = False  # end this plan's running jobs that it no longer has (as `plan cancel` does)
    allow_shared_output: tuple[str, ...] = ()  # paths another plan's job on the root may write too
    source: str = ""  # the plan file's path, recorded with the push (who pushed this plan from where)


@dataclass
class PushPlan:
    host: str
    plan: str
    changes: list[Change]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    host_state: dict[str, Any] = field(default_factory=dict)
    reruns: list[str] | None = None  # jobs that ran and that this push surely runs again (None: no stamps kept)
    maybe: list[str] = field(default_factory=list)  # jobs that ran, queued again, whose DONE_IF decides
    previous: dict[str, Any] | None = None  # the last push of this plan, when it came from another source
    refused: list[dict[str, Any]] = field(default_factory=list)  # each job another owner holds: job, state, plan

    def counts(self) -> Counter[str]:
        return Counter(c.mark for c in self.changes)

    def has_work(self) -> bool:
        return bool(
            self.request.get("files")
            or self.request.get("remove")
            or self.request.get("resets")
            or self.request.get("record") is not None
            or self.request.get("submit")
            or self.request.get("stale")
            or self.request.get("stop")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "plan": self.plan,
            "changes": [asdict(c) for c in self.changes],
            "counts": dict(self.counts()),
            "warnings": self.warnings,
            "errors": self.errors,
            "host_state": self.host_state,
            "reruns": self.reruns,
            "maybe_reruns": self.maybe,
            "previous_push": self.previous,
            "refused": self.refused,  # every job the errors' grouped refusals count
        }

    def text(self) -> str:
        lines = [f"push {self.plan} -> {self.host}"]
        again = set(self.reruns or ()) | set(self.maybe)
        for mark in ORDER:
            for change in (c for c in self.changes if c.mark == mark and c.job not in again):
                if mark in ("=", "d") and not change.note:
                    continue
                lines.append(_line(change))
        rerun = [c for c in self.changes if c.job in again]
        if rerun:  # last, the costly part: what this push makes run again, the most to redo first
            known = [c.cost for c in rerun if c.cost is not None]
            cost = f", {_size(sum(known))} of outputs to redo" if known else ""
            lines.append(f"  runs again ({len(rerun)} job{'s' * (len(rerun) != 1)}{cost}):")
            lines += [_line(c) for c in sorted(rerun, key=lambda c: (-(c.cost or 0), ORDER.index(c.mark), c.job))]
        counts = self.counts()
        if counts:  # a push refused before any job was judged has none
            lines.append("  " + ", ".join(f"{counts[m]} {MARKS[m]}" for m in ORDER if counts[m]))
        if self.reruns:
            lines.append(f"  will run again: {', '.join(self.reruns)}")
        retried = {c.job for c in self.changes if c.mark == "r"}
        sent_back = [n for n in self.maybe if n not in retried]
        if sent_back:
            lines.append(f"  queued again, its DONE_IF decides (no stamp): {', '.join(sent_back)}")
        judged = sorted(retried & set(self.maybe))  # failed jobs sent back: a failed run may have left its outputs
        if judged:
            lines.append(f"  retried, runs unless its DONE_IF holds already: {', '.join(judged)}")
        quiet = self.reruns is not None and not self.reruns and not self.maybe
        if quiet and any(c.state == "done" for c in self.changes):
            lines.append("  nothing will run again")
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def _line(change: Change) -> str:
    note = f"  ({change.note})" if change.note else ""
    cost = ""
    if change.cost is not None:
        cost = f"  [{'at least ' if change.cost_floor else ''}{_size(change.cost)}]"
    return f"  {change.mark:<2} {change.job}{note}{cost}"


def _size(size: int) -> str:
    from runner.stamps import format_size

    return format_size(size)


@dataclass
class PushOutcome:
    diff: PushPlan
    applied: bool = False
    notes: list[str] = field(default_factory=list)  # what happened, a line each, for stderr
    results: list[str] = field(default_factory=list)  # what was done, a line each, for stdout


@dataclass(frozen=True)
class ReportSource:
    """The events a report is built from (JSON lines, runner vocabulary), notes on where they came from, and the
    status answer they came with (a queue's: the runner's liveness at the window's end; {} where there is none)."""

    text: str
    notes: tuple[str, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)


class PushSession(Protocol):
    """One push in progress: the host is held (where it can be) from diff to apply."""

    def diff(self, compiled: Compiled, options: PushOptions) -> PushPlan: ...

    def apply(self, diff: PushPlan) -> PushOutcome: ...

    def landed(self, diff: PushPlan) -> bool | None:
        """After an apply that was interrupted: whether DIFF was applied (None: it cannot be told)."""
        ...


class Backend(Protocol):
    host: Host

    def push_session(self, options: PushOptions) -> AbstractContextManager[PushSession]:
        """Probe to install under the host's push lock (not taken for a dry run)."""
        ...

    def status(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The status answer: status.json's shape, an events window from request's offset, counts."""
        ...

    def report_source(self, since: str | None, plan: str | None = None) -> ReportSource: ...

    def operate(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """park, control (retry, cancel), logs, bootstrap: one request to the host's agent."""
        ...
