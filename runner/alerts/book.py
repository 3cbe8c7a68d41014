"""The incident book: causes (runner.alerts.causes) open an incident once, repeat it every --realert while it lasts,
and RECOVER it when it ends; an ack silences it until it recovers, its time passes, or it changes (a job joins a
kind in JOINING_IS_NEWS: the incident is sent again, as `changed`, naming it). Kept by the runner in
ROOT/incidents.json, read by `plan watch`, `plan status` and `plan top`.

incidents.json (written atomically, `version` 1):

    {"version": 1, "host": "a9", "updated": 1764800000.0, "zone": "+0900",
     "open": [INCIDENT, ...],            # in the order they opened
     "closed": [INCIDENT, ...],          # the last CLOSED_KEPT that recovered, newest last, with "recovered"
     "sent": 12}                         # notices given out so far (opens, repeats, recoveries)

    INCIDENT = {"id": "gpu-held:pid 1234", "kind": "gpu-held", "subject": "pid 1234",
                "text": "gpu lane held by pid 1234 (llama-server) ...", "jobs": ["84c-....job", ...],
                "count": 60, "look": "plan status a9", "opened": EPOCH, "seen": EPOCH, "sent": EPOCH or null,
                "sends": 1, "acked": null or {"by": "me@laptop", "at": EPOCH, "until": EPOCH or null},
                "joined": null or {"at": EPOCH, "jobs": ["92c-....job", ...]}}

Times are epoch seconds on the box's clock. `jobs` lists at most JOBS_KEPT names; `count` is how many. `joined` is
the last change that ended an ack: when, and the jobs that joined (at most JOBS_KEPT).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from runner.alerts.causes import CAUSE_KINDS, JOINING_IS_NEWS, Cause, names

__all__ = ["BOOK_FILE", "CAUSE_KINDS", "Book", "Incident", "Notice", "known_kind", "matching"]
from runner.durations import format_duration
from runner.files import atomic_write, read_json_or_none
from runner.records import Record

BOOK_FILE = "incidents.json"
BOOK_VERSION = 1
JOBS_KEPT = 50
CLOSED_KEPT = 20
REWRITE_S = 60.0  # a changed text alone (a duration, a job's progress) is written at most this often


class Incident(Record):
    """One cause as the book keeps it, open or closed (a record: runner.records; `to_json` is its file's entry)."""

    __slots__ = (
        "id",
        "kind",
        "subject",
        "text",
        "jobs",
        "count",
        "look",
        "opened",
        "seen",
        "sent",
        "sends",
        "acked",
        "joined",
        "recovered",
    )

    def __init__(
        self,
        id: str,
        kind: str,
        subject: str,
        text: str,
        jobs: list[str],
        count: int,
        look: str,
        opened: float,
        seen: float,
        sent: float | None = None,
        sends: int = 0,
        acked: dict[str, Any] | None = None,
        joined: dict[str, Any] | None = None,
        recovered: float | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.subject = subject
        self.text = text
        self.jobs = jobs
        self.count = count
        self.look = look
        self.opened = opened
        self.seen = seen
        self.sent = sent
        self.sends = sends
        self.acked = acked
        self.joined = joined
        self.recovered = recovered

    def to_json(self) -> dict[str, Any]:
        """Its fields by name, in order, its lists and dicts copied (what dataclasses.asdict gave; what they hold
        is strings and numbers, or whatever JSON a hand-edited book had)."""
        return {name: _copied(getattr(self, name)) for name in self.__slots__}

    @classmethod
    def load(cls, raw: Any) -> Incident | None:
        if not isinstance(raw, dict):
            return None
        try:
            known = {k: raw[k] for k in cls.__slots__ if k in raw}
            incident = cls(**known)
        except TypeError:
            return None
        if not isinstance(incident.id, str) or not isinstance(incident.opened, (int, float)):
            return None
        return incident

    def summary(self, now: float, host: str) -> str:
        """The one line a notification carries: what, since when, the command to look."""
        look = self.look.replace("HOST", host)
        return f"{host}: {self.text}{self.news()} (open {format_duration(now - self.opened)}; look: {look})"

    def news(self) -> str:
        """What ended its last ack, while it is not acked again: the jobs that joined (the text may name others)."""
        joined = self.joined.get("jobs") if isinstance(self.joined, dict) and not self.acked else None
        return f"; new since the ack: {names([str(j) for j in joined])}" if isinstance(joined, list) and joined else ""


def _copied(value: Any) -> Any:
    """VALUE, its lists and dicts copied all the way down (a JSON value's share of copy.deepcopy)."""
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


class Notice(NamedTuple):
    """One thing to tell a person: an incident opened, is still open (a repeat), or recovered."""

    what: str  # open, repeat, changed (a job joined it while acked: the ack ended), recovered
    incident: Incident
    host: str
    at: float

    @property
    def title(self) -> str:
        word = {"open": "", "repeat": "still: ", "changed": "changed: ", "recovered": "RECOVERED: "}[self.what]
        return f"{word}{self.incident.kind} on {self.host}"

    @property
    def message(self) -> str:
        i = self.incident
        if self.what == "recovered":
            lasted = format_duration((i.recovered or self.at) - i.opened)
            return f"{self.host}: recovered after {lasted}: {i.text}"
        return i.summary(self.at, self.host)

    def payload(self) -> dict[str, Any]:
        """The JSON a webhook receives."""
        return {
            "what": self.what,
            "title": self.title,
            "message": self.message,
            "host": self.host,
            "at": self.at,
            "kind": self.incident.kind,
            "watch_kind": CAUSE_KINDS.get(self.incident.kind, "EVENT"),
            "incident": self.incident.to_json(),
        }


class Book(Record):
    """The incidents a box knows of, open and lately closed, and what of them was last written (incidents.json)."""

    __slots__ = ("host", "open", "closed", "sent", "written", "written_shape", "written_at", "members")

    def __init__(
        self,
        host: str = "",
        open: dict[str, Incident] | None = None,
        closed: list[Incident] | None = None,
        sent: int = 0,
        written: str = "",
        written_shape: str = "",
        written_at: float = 0.0,
        members: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.host = host
        self.open: dict[str, Incident] = {} if open is None else open
        self.closed: list[Incident] = [] if closed is None else closed
        self.sent = sent
        self.written = written  # the content last written, less its clock
        self.written_shape = written_shape  # its ids, counts, sends and acks
        self.written_at = written_at
        # each open incident's jobs as the last tick saw them, all of them (the file keeps JOBS_KEPT): what a job
        # that joins since is told from. Not written: the cause's own tuple, kept, not copied.
        self.members: dict[str, tuple[str, ...]] = {} if members is None else members

    # -- the engine ----------------------------------------------------------------------------
    def reconcile(self, causes: list[Cause], now: float, realert: float, every: dict[str, float]) -> list[Notice]:
        """Open, repeat and close incidents against the causes true now; the notices to give, in order.
        REALERT is the repeat interval, EVERY a kind's own (0: never repeated). An acked incident is silent until
        a job joins it where that is news (JOINING_IS_NEWS): then it is sent once, as `changed`, unacked."""
        notices: list[Notice] = []
        current = {c.id: c for c in causes}
        for key in [k for k in self.open if k not in current]:
            incident = self.open.pop(key)
            self.members.pop(key, None)
            incident.recovered = now
            self.closed = (self.closed + [incident])[-CLOSED_KEPT:]
            if not incident.acked:
                notices.append(Notice("recovered", incident, self.host, now))
        for key, cause in current.items():
            found = self.open.get(key)
            incident = (
                found
                if found is not None
                else Incident(key, cause.kind, cause.subject, cause.text, [], 0, cause.look, opened=now, seen=now)
            )
            self.open[key] = incident
            incident.text, incident.look, incident.seen = cause.text, cause.look, now
            incident.jobs, incident.count = list(cause.jobs[:JOBS_KEPT]), len(cause.jobs)
            before, self.members[key] = self.members.get(key), cause.jobs
            acked = incident.acked
            if acked and acked.get("until") is not None and now >= float(acked["until"]):
                incident.acked = acked = None
            if acked:
                joined = _joined(cause, before)
                if not joined:
                    continue
                # a change the ack did not cover (a new failure): said at once, and the ack ends
                incident.acked, incident.joined = None, {"at": now, "jobs": joined[:JOBS_KEPT]}
                incident.sent, incident.sends = now, incident.sends + 1
                notices.append(Notice("changed", incident, self.host, now))
                continue
            repeat = every.get(cause.kind, realert)
            if incident.sent is None or (repeat > 0 and now - incident.sent >= repeat):
                what = "open" if incident.sent is None else "repeat"
                incident.sent, incident.sends = now, incident.sends + 1
                notices.append(Notice(what, incident, self.host, now))
        self.sent += len(notices)
        return notices

    def ack(self, target: str, until: float | None, by: str, now: float) -> list[Incident]:
        """Silence every open incident TARGET names, until it recovers, changes (see reconcile) or UNTIL. TARGET is
        `KIND` (a cause kind or a `plan watch` kind: every open one of it), `KIND:PATTERN` (matched against the
        subject and each job, `*` allowed) or `*`. A later ack of the same incident replaces the earlier one."""
        found = matching(list(self.open.values()), target)
        for incident in found:
            incident.acked = {"by": by, "at": now, "until": until}
        return found

    # -- the file ------------------------------------------------------------------------------
    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "version": BOOK_VERSION,
            "host": self.host,
            "updated": now,
            "zone": time.strftime("%z", time.localtime(now)),
            "open": [i.to_json() for i in sorted(self.open.values(), key=lambda i: (i.opened, i.id))],
            "closed": [i.to_json() for i in self.closed],
            "sent": self.sent,
        }

    def save(self, root: Path, now: float, force: bool = False) -> bool:
        """Written when what it holds changed: at once for an open, a close, a send or an ack, at most every
        REWRITE_S for a changed text alone. True when written."""
        data = self.to_json(now)
        shape = json.dumps([[i["id"], i["count"], i["sends"], i["acked"]] for i in data["open"]] + [data["sent"]])
        text = json.dumps({k: v for k, v in data.items() if k != "updated"}, sort_keys=True)
        if not force and text == self.written:
            return False
        if not force and shape == self.written_shape and now - self.written_at < REWRITE_S:
            return False
        # Not synced: a crash loses at most the last minute's texts; the runner writes the book again at start.
        atomic_write(root / BOOK_FILE, (json.dumps(data, indent=1) + "\n").encode(), durable=False)
        self.written, self.written_shape, self.written_at = text, shape, now
        return True

    @classmethod
    def load(cls, root: Path, host: str) -> Book:
        """The book an earlier life of the runner left: its incidents stay open (and are not sent again)."""
        raw = read_json_or_none(os.path.join(str(root), BOOK_FILE))
        book = cls(host=host)
        if not isinstance(raw, dict):
            return book
        for item in raw.get("open") or []:
            incident = Incident.load(item)
            if incident is not None:
                book.open[incident.id] = incident
        book.closed = [i for i in (Incident.load(x) for x in raw.get("closed") or []) if i is not None][-CLOSED_KEPT:]
        sent = raw.get("sent")
        book.sent = sent if isinstance(sent, int) else 0
        # Its jobs where the file holds all of them; else the first tick's are the ones a join is told from.
        book.members = {
            key: tuple(i.jobs) for key, i in book.open.items() if isinstance(i.jobs, list) and len(i.jobs) == i.count
        }
        return book


def _joined(cause: Cause, before: tuple[str, ...] | None) -> list[str]:
    """The jobs of CAUSE that were not among BEFORE (its jobs a tick ago), where a job joining its kind is news."""
    if cause.kind not in JOINING_IS_NEWS or before is None or cause.jobs == before:
        return []
    known = set(before)
    return [job for job in cause.jobs if job not in known]


def matching(incidents: list[Incident], target: str) -> list[Incident]:
    """The incidents TARGET names (see Book.ack); kinds compare without case, `plan watch` kinds map to causes."""
    import fnmatch  # only for an ack

    kind, _, pattern = target.strip().partition(":")
    kind = kind.strip()
    found = []
    for incident in incidents:
        if kind not in ("*", "") and kind.lower() != incident.kind and kind.upper() != CAUSE_KINDS.get(incident.kind):
            continue
        if pattern and not any(
            fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".job")
            for name in [incident.subject, *incident.jobs]
        ):
            continue
        found.append(incident)
    return found


def known_kind(target: str) -> bool:
    kind = target.strip().partition(":")[0].strip()
    return kind in ("*", "") or kind.lower() in CAUSE_KINDS or kind.upper() in set(CAUSE_KINDS.values())
