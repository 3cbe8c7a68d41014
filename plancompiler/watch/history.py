"""`plan status HOST --history`: the last ends, one line each (like `pueue status` or `squeue -t all`), from events."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from plancompiler.errors import PlanError
from runner.durations import format_duration
from runner.readers import terminal_safe
from runner.vocab import Event

# The event that ends a job's attempt (or decides it without a run) -> the outcome a history line shows. A
# `timeout` event is followed by the `failed` or `retry` that ends that attempt: the line is that one's.
OUTCOMES = {
    Event.DONE.value: "done",
    Event.FAILED.value: "failed",
    Event.RETRY.value: "retry",
    Event.CANCELLED.value: "cancelled",
    Event.SKIPPED.value: "skipped",
    Event.INVALID.value: "invalid",
    Event.START_FAILED.value: "start-failed",
}
OUTCOME_NAMES = (*OUTCOMES.values(), "timeout")


@dataclass(frozen=True)
class End:
    job: str
    outcome: str
    ts: str  # when it ended (the event's time)
    start: str | None  # when the attempt started, from its `start` event where the window holds it
    duration_s: float | None
    cpu_s: float | None
    peak_rss_mb: float | None
    attempt: int | None
    lane: str
    plan: str


class HistoryError(PlanError):
    """A filter that names nothing that can be: exit 2, with the closest name."""


def check_outcome(outcome: str | None) -> None:
    if outcome is not None and outcome not in OUTCOME_NAMES:
        hint = difflib.get_close_matches(outcome, OUTCOME_NAMES, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise HistoryError(f"--outcome {outcome!r} is no outcome{suggestion} (one of {', '.join(OUTCOME_NAMES)})")


def ends(events: Sequence[dict[str, Any]]) -> list[End]:
    """Every end in EVENTS (a window of events.jsonl, in file order), oldest first."""
    started: dict[str, tuple[str, str, Any]] = {}  # job -> (its last start's time, lane, attempt)
    timed_out: set[str] = set()
    found: list[End] = []
    for event in events:
        kind, job = event.get("event"), str(event.get("job", "-"))
        if job == "-":
            continue
        if kind == Event.START.value:
            started[job] = (str(event.get("ts", "")), str(event.get("lane", "")), event.get("attempt"))
            timed_out.discard(job)
            continue
        if kind == Event.TIMEOUT.value:
            timed_out.add(job)
            continue
        if kind not in OUTCOMES:
            continue
        if kind == Event.CANCELLED.value and event.get("was") == "queued":
            start, lane, attempt = None, "", None
        else:
            start, lane, attempt = started.pop(job, (None, "", None))
        attempt = event.get("attempt", attempt)
        outcome = OUTCOMES[kind]
        if kind == Event.FAILED.value and (event.get("why") == "timeout" or job in timed_out):
            outcome = "timeout"
        timed_out.discard(job)
        found.append(
            End(
                job=job,
                outcome=outcome,
                ts=str(event.get("ts", "")),
                start=start,
                duration_s=_number(event.get("duration_s")),
                cpu_s=_number(event.get("cpu_s")),
                peak_rss_mb=_number(event.get("peak_rss_mb")),
                attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                lane=str(event.get("lane") or lane),
                plan=str(event.get("plan") or ""),
            )
        )
    return found


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def select(
    events: Sequence[dict[str, Any]],
    last: int,
    plan: str | None = None,
    lane: str | None = None,
    outcome: str | None = None,
) -> list[End]:
    """The LAST ends in EVENTS that pass the filters (a plan by its name, with or without its @hash), oldest first."""
    check_outcome(outcome)
    kept = [
        end
        for end in ends(events)
        if (plan is None or end.plan.split("@")[0] == plan.split("@")[0])
        and (lane is None or end.lane == lane)
        and (outcome is None or end.outcome == outcome)
    ]
    return kept[-last:] if last > 0 else []


def to_json(selected: Sequence[End]) -> list[dict[str, Any]]:
    return [asdict(end) for end in selected]


def text(selected: Sequence[End], described: str) -> str:
    """One line an end: start, duration, outcome, cpu, peak memory, attempt, lane, job (safe for a terminal)."""
    if not selected:
        return f"{described}: no ends in the events read"
    width = max(len(e.job) for e in selected)
    lines = [f"{'started':<19}  {'took':>7}  {'outcome':<12} {'cpu':>7} {'peak':>9}  try  {'lane':<5} job"]
    for end in selected:
        took = format_duration(end.duration_s) if end.duration_s is not None else "-"
        cpu = format_duration(end.cpu_s) if end.cpu_s is not None else "-"
        peak = _megabytes(end.peak_rss_mb)
        attempt = f"#{end.attempt}" if end.attempt is not None else "-"
        lines.append(
            f"{end.start or end.ts:<19}  {took:>7}  {end.outcome:<12} {cpu:>7} {peak:>9}  {attempt:<4} "
            f"{end.lane or '-':<5} {end.job:<{width}}"
        )
    return terminal_safe("\n".join(line.rstrip() for line in lines))


def _megabytes(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"
