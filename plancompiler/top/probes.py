"""`plan top`'s probes: one thread per host, one bounded `plan watch` probe in flight at a time, every interval.

A probe that hangs holds only its own host's thread (until the host's timeout ends it); the screen reads each
host's latest view without waiting, so a host that does not answer is shown as such, never a frozen screen.
The incidents are `plan watch`'s: the box's own book (its runner judges them; an ack goes to the box, as `plan ack`
sends it) and what only the outside can judge (DEAD, STOPPED, UNREACHABLE, ERROR, SKEW; acked in the watcher's book).
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
from plancompiler.watch import (
    AckError,
    Incident,
    Rules,
    WatchState,
    ack,
    book_of,
    probe,
    reconcile,
    take_box_acks,
)
from runner.readers import valid_events

_KEEP_ENDS = 20
BOX_ACK_WAIT_S = 10.0  # how long an ack on the box waits for its runner to take it
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
        # incidents the box's own book holds (by key): when each opened and its text
        self.on_box: dict[str, tuple[float | None, str]] = {}

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
            if seen.answer is not None:
                self.on_box = _box_opened(seen.answer, seen.box_acked)
            take_box_acks(self.state.incidents, seen.conditions, seen.box_acked, now)
            _take_acks({k: i for k, i in self.state.incidents.items() if k not in self.on_box}, book.incidents)
            for key, (opened, text) in self.on_box.items():  # as the box says: since when (its clock), and what
                if key in self.state.incidents:
                    self.state.incidents[key].opened = opened or self.state.incidents[key].opened
                    self.state.incidents[key].detail = text or self.state.incidents[key].detail
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
                # said as what it was: a host not reached (UNREACHABLE), or reached with a queue it could not read
                # (ERROR: a root that does not exist), as `plan watch` says it
                failure = "; ".join(f"{c.kind}: {c.detail}" for c in seen.conditions) or (
                    f"UNREACHABLE: {seen.note or 'no answer'}"
                )
                self.view = replace(self.view, probing_since=None, failure=failure, incidents=incidents)

    def current(self) -> HostView:
        with self.lock:
            return self.view

    def ack(self, key: str) -> str:
        """Ack the open incident KEY (KIND:SUBJECT): on the box when its runner's book holds it (every channel the box
        notifies goes quiet, as `plan ack` does), else in the watcher's book, where `plan watch` and `plan ack` see
        it. Called from a background thread: the box's ack waits for its runner to take it."""
        with self.lock:
            mine = self.state.incidents.get(key)
            box = key in self.on_box
        if mine is None:
            return f"{key} is no longer open on {self.host.name}"
        if box:
            from plancompiler.commands import operate

            said = operate.ack_on_box(self.host, mine.subject, None, BOX_ACK_WAIT_S, None)
            if said is not None:
                with self.lock:
                    mine.acked, mine.acked_until = True, None
                    self.view = replace(self.view, incidents=tuple(replace(i) for i in self.state.incidents.values()))
                return "; ".join(said)
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


def _box_opened(answer: dict[str, Any], acked: dict[str, bool]) -> dict[str, tuple[float | None, str]]:
    """The keys of the conditions the box's book gave (ACKED's keys, KIND:ID), each with when the box opened it and
    its text."""
    book = book_of(answer) or {}
    found: dict[Any, tuple[float | None, str]] = {}
    for raw in book.get("open") or []:
        if isinstance(raw, dict):
            opened = raw.get("opened")
            found[raw.get("id")] = (
                float(opened) if isinstance(opened, (int, float)) else None,
                str(raw.get("text") or ""),
            )
    return {key: found.get(key.partition(":")[2], (None, "")) for key in acked}


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
