"""`plan top`'s probes: one thread per host, one bounded `plan watch` probe in flight at a time, every interval.

A probe that hangs holds only its own host's thread (until the host's timeout ends it); the screen reads each
host's latest view without waiting, so a host that does not answer is shown as such, never a frozen screen.
The incidents are judged as `plan watch` judges them; an ack goes into the watcher's book (`plan ack`'s file),
which this book also reads, so an incident acked in either place is acked in both.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from plancompiler.hosts import Host
from plancompiler.top.frame import HostView, is_end
from plancompiler.watch import AckError, Incident, Rules, WatchState, ack, probe, reconcile
from runner.readers import valid_events

_KEEP_ENDS = 20
_NEVER = float("inf")  # top shows incidents; it never sends them again


class HostProbe:
    def __init__(self, host: Host, interval: float, book: Path, rules: Rules | None = None) -> None:
        self.host = host
        self.interval = interval
        self.book = book
        self.rules = rules or Rules()
        self.state = WatchState()  # this screen's own offset and incidents: `plan watch`'s are left as they are
        self.lock = threading.Lock()
        self.view = HostView(host.name, f"{host.ssh}:{host.root}" if host.ssh else host.root, interval)
        self.ends: deque[dict[str, Any]] = deque(maxlen=_KEEP_ENDS)
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.probes = 0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=f"top-probe-{self.host.name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            self.once()
            self.wake.wait(max(0.0, self.interval - (time.monotonic() - began)))
            self.wake.clear()

    def once(self) -> None:
        """One probe, its answer and incidents folded into the view."""
        with self.lock:
            self.view = replace(self.view, probing_since=time.time())
        seen = probe(self.host, self.state, self.rules, self.host.timeout, extra={"estimates": True})
        now = time.time()
        book = WatchState.load(self.book)
        with self.lock:
            self.probes += 1
            reconcile(self.state.incidents, seen.conditions, now, {}, _NEVER, seen.judged)
            _take_acks(self.state.incidents, book.incidents)
            incidents = tuple(replace(i) for i in self.state.incidents.values())
            if seen.answer is not None:
                raw = seen.answer.get("events")
                events, _ = valid_events(raw if isinstance(raw, list) else [], "event")
                self.ends.extend(e for e in events if is_end(e))
                self.view = replace(
                    self.view,
                    answer=seen.answer,
                    answered=now,
                    probing_since=None,
                    failure="",
                    incidents=incidents,
                    ends=tuple(self.ends),
                )
            else:
                failure = seen.note or "; ".join(c.detail for c in seen.conditions) or "no answer"
                self.view = replace(self.view, probing_since=None, failure=failure, incidents=incidents)

    def current(self) -> HostView:
        with self.lock:
            return self.view

    def ack(self, key: str) -> str:
        """Ack the open incident KEY (KIND:SUBJECT) in the watcher's book, where `plan watch` and `plan ack` see it."""
        now = time.time()
        with self.lock:
            mine = self.state.incidents.get(key)
            if mine is None:
                return f"{key} is no longer open on {self.host.name}"
            book = WatchState.load(self.book)
            if key not in book.incidents:
                book.incidents[key] = replace(mine, acked=False, acked_until=None)
            try:
                ack(book.incidents, key, None, now)
            except AckError as exc:
                return str(exc)
            book.save(self.book)
            mine.acked, mine.acked_until = True, None
            self.view = replace(self.view, incidents=tuple(replace(i) for i in self.state.incidents.values()))
        return f"acked {key} on {self.host.name} until it changes or recovers"


def _take_acks(mine: dict[str, Incident], book: dict[str, Incident]) -> None:
    """What the watcher's book knows of an incident this screen sees: since when it is open (the watcher may have
    seen it long before this screen started), and an ack for what is true now (the same fingerprint)."""
    for key, incident in mine.items():
        other = book.get(key)
        if other is None:
            continue
        incident.opened = min(incident.opened, other.opened)
        if other.acked and other.fingerprint == incident.fingerprint:
            if other.acked_until is None or other.acked_until > time.time():
                incident.acked, incident.acked_until = True, other.acked_until
