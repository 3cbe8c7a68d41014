"""`plan status`'s screen: a host's answer as text a person reads at a glance, made safe for a terminal."""

from __future__ import annotations

from typing import Any

from plancompiler.hosts import Host
from plancompiler.watch.book import book_conditions, book_of
from plancompiler.watch.judge import ENDS, answer_now, checked_events, status_corrupt
from runner.readers import terminal_safe
from runner.views.status import render_status, runner_down


def status_text(host: Host, answer: dict[str, Any], every: bool = False) -> str:
    """`plan status`'s screen, made safe for a terminal: job output can hold escape sequences. EVERY (`--all`):
    each waiting job on a line of its own, instead of grouped by reason and blocker."""
    return terminal_safe(_status_text(host, answer, every))


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _status_text(host: Host, answer: dict[str, Any], every: bool = False) -> str:
    events, skipped = checked_events(answer)
    note = (
        (
            f"\n\nskipped {plural(len(skipped), 'malformed event')}: "
            + "; ".join(skipped[:5])
            + ("; ..." if len(skipped) > 5 else "")
        )
        if skipped
        else ""
    )
    now = answer_now(answer)
    corrupt = status_corrupt(answer)
    status = None if corrupt else answer.get("status")
    counts: dict[str, Any] = answer["counts"] if isinstance(answer.get("counts"), dict) else {}
    if status is None:
        why = f"its {corrupt}" if corrupt else "no runner has ever ticked here (no status.json)"
        return f"{host.describe()}: {why}; jobs: " + "  ".join(f"{k} {v}" for k, v in counts.items()) + note
    if counts:  # the job files in each state as the agent counted them now; status.json's are a tick old or more
        status = dict(status, counts=counts)
    estimates = answer.get("estimates")
    text = render_status(status, now, every, estimates if isinstance(estimates, dict) else None)
    if not answer.get("runner_alive", True):
        text = runner_down(status, answer.get("runner_stopped"), counts.get("queue")) + "\n" + text
    ends = [e for e in events if e.get("event") in ENDS]
    if ends:
        text += "\n\nrecent ends:\n" + "\n".join(
            f"  {e['ts']}  {e['event']:<8} {e['job']}" + (f"  rc {e['rc']}" if "rc" in e else "") for e in ends[-8:]
        )
    return text + incidents_text(answer, host.name, now) + note


def incidents_text(answer: dict[str, Any], host: str, now: float) -> str:
    """The box's open incidents (its book), one line each, for `plan status`."""
    book = book_of(answer)
    if book is None:
        return ""
    conditions, acked = book_conditions(book, host, now)
    if not conditions:
        return ""
    lines = [f"  {c.kind:<8} {c.detail}" + ("  (acked)" if acked.get(c.key) else "") for c in conditions]
    return "\n\nopen incidents (the box's book):\n" + "\n".join(lines)
