"""`plan watch` on a box whose runner keeps the incident book (runner/alerts/book.py): the book's open incidents
become the watcher's conditions (one per cause, as the box judged them, acked where the box says so), and
the watcher adds only what the box cannot judge about itself: DEAD, STOPPED, UNREACHABLE, ERROR and clock SKEW.
After a gap (a stopped or sleeping watcher, failed probes) what changed meanwhile is one DIGEST, not a replay."""

from __future__ import annotations

from typing import Any

from plancompiler.watch.incidents import Alert, Condition, Incident
from runner.alerts.book import CAUSE_KINDS
from runner.alerts.book import Incident as BoxIncident
from runner.durations import format_duration

SKEW_S = 60.0  # box and workstation clocks further apart than this (beyond the probe's own time) open SKEW
DIGEST_NAMES = 4  # a digest names this many of each list, then "+N"


def book_of(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The answer's incident book, when its runner keeps one (a runner before the book, or Slurm: None)."""
    book = answer.get("incidents")
    if isinstance(book, dict) and isinstance(book.get("version"), int) and isinstance(book.get("open"), list):
        return book
    return None


def book_conditions(book: dict[str, Any], host: str, now: float) -> tuple[list[Condition], dict[str, bool]]:
    """One condition per open incident of the book (its kind as `plan watch` names it), and whether the box has
    acked each (by the condition's key). Its fingerprint is the incident's life and the last change that ended an
    ack there (`joined`): such a change is news here too, at once."""
    conditions, acked = [], {}
    for raw in book["open"]:
        incident = BoxIncident.load(raw)
        if incident is None:
            continue
        kind = CAUSE_KINDS.get(incident.kind, "EVENT")
        joined = incident.joined.get("at") if isinstance(incident.joined, dict) else None
        fingerprint = f"{incident.id}@{incident.opened}" + (f"+{joined}" if joined is not None else "")
        condition = Condition(kind, incident.id, incident.summary(now, host), fingerprint)
        conditions.append(condition)
        acked[condition.key] = bool(incident.acked)
    return conditions, acked


def take_box_acks(
    incidents: dict[str, Incident], conditions: list[Condition], acked: dict[str, bool], now: float
) -> None:
    """The box's acks laid over the watcher's incidents: one acked there is silent here (opened silent if it was
    acked before this watcher saw it), whatever changed there before it was acked again; one whose ack ended
    there is live again."""
    for condition in conditions:
        key = condition.key
        if key not in acked:
            continue
        on_box = acked[key]
        mine = incidents.get(key)
        if mine is None:
            if on_box:
                incidents[key] = Incident(
                    condition.kind, condition.subject, condition.detail, condition.fingerprint, now, now, now
                )
                incidents[key].acked = True
            continue
        mine.acked = on_box
        mine.acked_until = None
        if on_box:
            mine.fingerprint = condition.fingerprint  # the box's ack covers what the box judges now


def skew_condition(box_now: float, sent: float, received: float, subject: str) -> Condition | None:
    """SKEW when the box's clock (its answer's `now`) and this one differ by more than SKEW_S beyond what the
    probe's own round trip can explain."""
    skew = box_now - (sent + received) / 2
    if abs(skew) <= SKEW_S + (received - sent) / 2:
        return None
    side = "ahead of" if skew > 0 else "behind"
    return Condition(
        "SKEW",
        subject,
        f"the box's clock is {format_duration(abs(skew))} {side} this workstation's: ages and times shown here are "
        "judged on the box's clock; set both by NTP",
        "skew",
    )


def _short(alert: Alert, host: str) -> str:
    """An alert's detail without what a digest says once: the host, and a book incident's age and command."""
    text = alert.detail
    for prefix in (f"{host}: ", f"{alert.subject}: "):
        text = text[len(prefix) :] if text.startswith(prefix) else text
    text = text.rpartition(" (open ")[0] or text
    return (f"{alert.kind} " if alert.kind not in ("RECOVERED", "EVENT") or "event" not in alert.extra else "") + text[
        :100
    ]


def digest(alerts: list[Alert], host: str, away_s: float, subject: str = "") -> Alert:
    """ALERTS, made while the watcher was away AWAY_S, said as one message."""
    events = [a for a in alerts if "event" in a.extra]
    recovered = [a for a in alerts if a.kind == "RECOVERED"]
    opened = [a for a in alerts if a not in events and a not in recovered and a.kind != "OK"]
    parts = []
    for word, group in (("open", opened), ("recovered", recovered), ("events", events)):
        if group:
            shown = "; ".join(_short(a, subject or host) for a in group[:DIGEST_NAMES])
            more = f" (+{len(group) - DIGEST_NAMES} more)" if len(group) > DIGEST_NAMES else ""
            parts.append(f"{len(group)} {word}: {shown}{more}")
    return Alert(
        "DIGEST",
        f"{host}: while this watcher was away for {format_duration(away_s)}: " + " | ".join(parts),
        host,
        {"alerts": [a.payload() for a in alerts], "away_s": round(away_s, 1)},
    )
