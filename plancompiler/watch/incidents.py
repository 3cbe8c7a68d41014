"""`plan watch`'s incidents: a standing condition opens one, it is sent again every --realert, it RECOVERS."""

from __future__ import annotations

import difflib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from plancompiler.errors import AckError as AckError  # its home is plancompiler/errors.py
from runner.durations import format_duration

# Exit codes of `plan watch`, one per kind; the first alert of a probe decides. RECOVERED and the
# all-clear OK are news, not trouble: they exit 0.
EXIT_CODES = {
    "EVENT": 10,
    "STALL": 11,
    "IDLE": 12,
    "BLOCKED": 13,
    "DEAD": 14,
    "UNREACHABLE": 15,
    "ERROR": 16,
    "PARKED": 17,
    "WAITING": 18,
    "DIGEST": 19,
    "SKEW": 20,
    "STOPPED": 21,
    "RECOVERED": 0,
    "OK": 0,
}
# The kinds that are states (judged on every probe) rather than one-off events: these are incidents.
INCIDENT_KINDS = (
    "STALL",
    "IDLE",
    "BLOCKED",
    "DEAD",
    "STOPPED",
    "UNREACHABLE",
    "ERROR",
    "PARKED",
    "WAITING",
    "SKEW",
)


@dataclass(frozen=True)
class Alert:
    kind: str
    detail: str
    subject: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.kind}: {self.detail}"

    def payload(self) -> dict[str, Any]:
        """What --on-alert reads on stdin."""
        return {"kind": self.kind, "detail": self.detail, "subject": self.subject, **self.extra}


@dataclass(frozen=True)
class Condition:
    """Something true of the host now. `fingerprint` is what an ack holds to: when it changes, the ack ends."""

    kind: str
    subject: str
    detail: str
    fingerprint: str = ""

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"


@dataclass
class Incident:
    kind: str
    subject: str
    detail: str
    fingerprint: str
    opened: float
    seen: float
    sent: float | None = None
    acked_until: float | None = None  # with `acked`: the ack's end (None: until the incident changes)
    acked: bool = False

    def describe(self, now: float) -> str:
        ack = ""
        if self.acked:
            ack = "  acked" + (f" until {_ts(self.acked_until)}" if self.acked_until else " until it changes")
        return (
            f"{self.kind:<11} {self.subject}  open {format_duration(now - self.opened)} "
            f"(since {_ts(self.opened)}){ack}: {self.detail}"
        )


def _ts(value: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if value else "-"


def load_incidents(data: Any) -> dict[str, Incident]:
    """The state file's `incidents`; anything unreadable is dropped rather than stopping the watcher."""
    result: dict[str, Incident] = {}
    if not isinstance(data, dict):
        return result
    for key, value in data.items():
        try:
            result[key] = Incident(**value)
        except TypeError:
            continue
    return result


def dump_incidents(incidents: dict[str, Incident]) -> dict[str, Any]:
    return {key: asdict(incident) for key, incident in incidents.items()}


def reconcile(
    incidents: dict[str, Incident],
    conditions: list[Condition],
    now: float,
    realert: dict[str, float],
    default_realert: float,
    judged: frozenset[str] | None = None,
) -> list[Alert]:
    """Open, repeat and close incidents against what is true now; the alerts to send, in order.

    JUDGED names the kinds this probe could judge (None: all); an open incident of another kind is
    left as it is: a probe that could not read the queue knows nothing new about a job's STALL.
    """
    alerts: list[Alert] = []
    current = {c.key: c for c in conditions}
    for key, was in list(incidents.items()):
        if key in current or (judged is not None and was.kind not in judged):
            continue
        del incidents[key]
        lasted = now - was.opened
        alerts.append(
            Alert(
                "RECOVERED",
                f"{was.kind} {was.subject} recovered after {format_duration(lasted)} (was: {was.detail})",
                was.subject,
                {"recovered": was.kind, "lasted_s": round(lasted, 1), "opened": _ts(was.opened)},
            )
        )
    for key, condition in current.items():
        incident = incidents.get(key)
        if incident is None:
            incident = incidents[key] = Incident(
                condition.kind, condition.subject, condition.detail, condition.fingerprint, opened=now, seen=now
            )
        changed = incident.fingerprint != condition.fingerprint
        incident.detail, incident.fingerprint, incident.seen = condition.detail, condition.fingerprint, now
        if incident.acked and (changed or (incident.acked_until is not None and now >= incident.acked_until)):
            incident.acked, incident.acked_until = False, None
            if changed:
                incident.sent = None  # what was acked is not what is true now: news at once
        if incident.acked:
            continue
        every = realert.get(condition.kind, default_realert)
        if incident.sent is None or changed or now - incident.sent >= every:
            incident.sent = now
            alerts.append(
                Alert(
                    condition.kind,
                    condition.detail,
                    condition.subject,
                    {"opened": _ts(incident.opened), "open_s": round(now - incident.opened, 1)},
                )
            )
    return alerts


def did_you_mean(word: str, known: list[str] | tuple[str, ...] | frozenset[str]) -> str:
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def ack(incidents: dict[str, Incident], target: str, until: float | None, now: float) -> Incident:
    """Silence the one open incident TARGET names (`KIND` or `KIND:SUBJECT`) until it changes or UNTIL."""
    kind, _, subject = target.partition(":")
    kind = kind.strip().upper()
    if kind not in INCIDENT_KINDS:
        from runner.alerts.book import CAUSE_KINDS  # what the box's runner judges: `plan ack` takes them too

        causes = sorted(CAUSE_KINDS)
        hint = did_you_mean(kind, INCIDENT_KINDS) or did_you_mean(target.partition(":")[0].strip().lower(), causes)
        raise AckError(
            f"unknown incident kind {kind!r}{hint} (kinds: {', '.join(INCIDENT_KINDS)}; the box's causes: "
            f"{', '.join(causes)}, or EVENT for every failure)",
            2,
        )
    found = [
        i for i in incidents.values() if i.kind == kind and (not subject or i.subject in (subject, f"{subject}.job"))
    ]
    if not found:
        open_ = ", ".join(f"{i.kind}:{i.subject}" for i in incidents.values()) or "none"
        raise AckError(f"no open incident {target} (open: {open_})", 1)
    if len(found) > 1:
        raise AckError(
            f"{target} names {len(found)} open incidents; say which: "
            + ", ".join(f"{i.kind}:{i.subject}" for i in found),
            1,
        )
    incident = found[0]
    incident.acked, incident.acked_until = True, until
    return incident
