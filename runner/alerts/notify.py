"""Telling a person, from the box itself: incident notices POSTed to --notify URLs and a dead-man's-switch --ping,
sent by one thread so that a slow or dead receiver never holds up a tick. Standard library (urllib) only.

A URL's form picks what is sent:
- `http(s)://...`: a generic webhook, JSON POSTed (runner.alerts.book.Notice.payload: what, title, message, ...);
- `ntfy://HOST/TOPIC`, `ntfys://HOST/TOPIC` (http, https) or any `https://ntfy.sh/TOPIC`: ntfy's plain-text form,
  the message as the body, its title, priority and tags as headers (a phone's ntfy app rings on it).
Each delivery has a deadline (--notify-timeout); a failed one is tried again after 5 s, 30 s, 2 m, 10 m, then
given up. Counts of sent, failed tries, given-up and dropped notices are in status.json's `delivery`.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BACKOFF_S = (5.0, 30.0, 120.0, 600.0)  # waits before the 2nd, 3rd, ... try of a notice
PENDING_MAX = 1000  # notices waiting to be sent; more are dropped (and counted)
NTFY_HOSTS = ("ntfy.sh",)
USER_AGENT = "plancompiler-runner"
# ntfy's priority and tags for a notice's `what` (a repeat, or a ping: the rest): a change that ended an ack is as
# urgent as an open
NTFY_PRIORITY = {"open": "high", "changed": "high", "recovered": "low"}
NTFY_TAGS = {"open": "warning", "changed": "warning", "recovered": "white_check_mark"}


class BadTarget(ValueError):
    """A --notify or --ping value that is not a URL this side can send to."""


@dataclass(frozen=True)
class Target:
    url: str  # what is requested (an ntfy:// URL already turned into http(s))
    form: str  # "webhook" or "ntfy"
    shown: str  # the URL as given, less any password (for status and errors)


def target(url: str) -> Target:
    """URL checked and classified; BadTarget says why it cannot be used."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme in ("ntfy", "ntfys"):
        if not parts.netloc or not parts.path.strip("/"):
            raise BadTarget(f"{url!r}: want {scheme}://HOST/TOPIC")
        real = urllib.parse.urlunsplit(("https" if scheme == "ntfys" else "http",) + tuple(parts[1:]))
        return Target(real, "ntfy", _shown(parts))
    if scheme not in ("http", "https") or not parts.netloc:
        raise BadTarget(f"{url!r}: want an http(s):// webhook URL, or ntfy://HOST/TOPIC")
    form = "ntfy" if parts.hostname in NTFY_HOSTS else "webhook"
    return Target(url.strip(), form, _shown(parts))


def _shown(parts: urllib.parse.SplitResult) -> str:
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def request_for(where: Target, payload: dict[str, Any]) -> urllib.request.Request:
    """The HTTP request that delivers PAYLOAD (a Notice's payload, or a ping's) to WHERE."""
    headers = {"User-Agent": USER_AGENT}
    if where.form == "ntfy":
        what = payload.get("what", "")
        headers["Title"] = _header(str(payload.get("title", "")))
        headers["Priority"] = NTFY_PRIORITY.get(what, "default")
        headers["Tags"] = NTFY_TAGS.get(what, "hourglass")
        body = str(payload.get("message", "")).encode("utf-8")
        headers["Content-Type"] = "text/plain; charset=utf-8"
    else:
        body = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    return urllib.request.Request(where.url, data=body, headers=headers, method="POST")


def _header(text: str) -> str:
    """A header value: one line of Latin-1 (http.client refuses anything else)."""
    return " ".join(text.split()).encode("latin-1", "replace").decode("latin-1")[:200]


def post(request: urllib.request.Request, timeout: float) -> None:
    """Send REQUEST; raises OSError (URLError, a timeout, an HTTP error status) when it was not accepted."""
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read(65536)


@dataclass(order=True)
class _Item:
    due: float
    seq: int
    send: Callable[[], None] = field(compare=False)
    label: str = field(compare=False)
    tries: int = field(default=0, compare=False)
    max_tries: int = field(default=len(BACKOFF_S) + 1, compare=False)


@dataclass
class Counts:
    sent: int = 0
    failed_tries: int = 0  # tries that failed (each is tried again until given up)
    given_up: int = 0
    dropped: int = 0  # more than PENDING_MAX were waiting
    pings: int = 0
    pings_failed: int = 0
    last_error: str = ""
    last_sent: float | None = None


class Outbox:
    """Deliveries made by one daemon thread, in due order, each with a deadline; the caller never waits."""

    def __init__(self, timeout: float = 10.0, backoff: tuple[float, ...] = BACKOFF_S) -> None:
        self.timeout = timeout
        self.backoff = backoff
        self.counts = Counts()
        self._heap: list[_Item] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- what the runner (or the watcher) calls ------------------------------------------------
    def notify(self, targets: list[Target], payload: dict[str, Any]) -> None:
        for where in targets:
            self._put(self._sender(request_for(where, payload)), f"notify {where.shown}", len(self.backoff) + 1)

    def _sender(self, request: urllib.request.Request) -> Callable[[], None]:
        return lambda: post(request, self.timeout)

    def ping(self, where: Target, body: str) -> None:
        """One dead-man's-switch ping: POST BODY (a one-line state) to WHERE; never tried twice (the next period's
        ping is the retry)."""
        request = urllib.request.Request(
            where.url, data=body.encode("utf-8"), headers={"User-Agent": USER_AGENT}, method="POST"
        )

        def send() -> None:
            try:
                post(request, self.timeout)
            except OSError:
                self.counts.pings_failed += 1
                raise
            self.counts.pings += 1

        self._put(send, f"ping {where.shown}", 1)

    def call(self, send: Callable[[], None], label: str) -> None:
        """Deliver by SEND (raising OSError when it did not go), with the same retries and counts: for senders
        of the workstation's own, such as apprise."""
        self._put(send, label, len(self.backoff) + 1)

    def pending(self) -> int:
        with self._cond:
            return len(self._heap) + int(self._busy)

    def status(self) -> dict[str, Any]:
        """What status.json shows under `delivery`."""
        c = self.counts
        return {
            "sent": c.sent,
            "failed_tries": c.failed_tries,
            "given_up": c.given_up,
            "dropped": c.dropped,
            "pending": self.pending(),
            "pings": c.pings,
            "pings_failed": c.pings_failed,
            "last_error": c.last_error or None,
            "last_sent": c.last_sent,
        }

    def close(self, deadline_s: float) -> None:
        """Give what is due now up to DEADLINE_S to go out (a runner's last notices as it stops), then stop."""
        end = time.monotonic() + deadline_s
        with self._cond:
            self._closing = True  # a try that fails now is not tried again
            for item in self._heap:
                item.due = min(item.due, time.monotonic())
            heapq.heapify(self._heap)
            self._cond.notify_all()
            while (self._heap or self._busy) and time.monotonic() < end:
                self._cond.wait(max(0.0, min(0.05, end - time.monotonic())))
            self._stopping = True
            self._cond.notify_all()

    # -- the thread ----------------------------------------------------------------------------
    def _put(self, send: Callable[[], None], label: str, max_tries: int) -> None:
        with self._cond:
            if len(self._heap) >= PENDING_MAX:
                self.counts.dropped += 1
                return
            heapq.heappush(self._heap, _Item(time.monotonic(), next(self._seq), send, label, 0, max_tries))
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="runner-notify", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._heap or self._heap[0].due > time.monotonic()):
                    wait = self._heap[0].due - time.monotonic() if self._heap else None
                    self._cond.wait(wait if wait is None else max(0.01, min(wait, 1.0)))
                if self._stopping:
                    return
                item = heapq.heappop(self._heap)
                self._busy = True
            error = None
            try:
                item.send()
            except (OSError, ValueError, http.client.HTTPException) as exc:  # a refused, timed-out or failed request
                error = _why(exc)
            with self._cond:
                self._busy = False
                self._settle(item, error)
                self._cond.notify_all()

    def _settle(self, item: _Item, error: str | None) -> None:
        if error is None:
            self.counts.sent += 1
            self.counts.last_sent = time.time()
            return
        self.counts.failed_tries += 1
        self.counts.last_error = f"{item.label}: {error}"[:300]
        item.tries += 1
        if item.tries >= item.max_tries or self._closing:
            self.counts.given_up += 1
            return
        item.due = time.monotonic() + self.backoff[min(item.tries - 1, len(self.backoff) - 1)]
        heapq.heappush(self._heap, item)


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__
