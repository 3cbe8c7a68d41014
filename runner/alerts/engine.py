"""The runner's alerting, once a tick: judge the causes (causes), keep the book (book), log each notice as an
`incident` event, hand it to the outbox (notify) for --notify, and ping --ping on time."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from runner.alerts.book import Book, Incident, Notice, known_kind
from runner.alerts.causes import CAUSE_KINDS, judge
from runner.vocab import Event

if TYPE_CHECKING:
    from runner.alerts.notify import Outbox, Target
    from runner.records import Parsed


class AckRefused(ValueError):
    """An ack request that names no open incident, or no kind there is."""


class Alerts:
    def __init__(self, runner: Any) -> None:
        self.config = config = runner.config
        self.runner = runner
        self.host = config.host_name or os.uname().nodename.split(".")[0] or "box"
        self.book = Book.load(runner.queue.root, self.host)
        self.book.host = self.host
        self.targets: list[Target] = []
        self.ping_target: Target | None = None
        self.outbox: Outbox | None = None
        if config.notify or config.ping:
            from runner.alerts import notify  # urllib and threads: only for a runner that sends

            self.targets = [notify.target(u) for u in config.notify]
            self.ping_target = notify.target(config.ping) if config.ping else None
            self.outbox = notify.Outbox(config.notify_timeout_s)
        self.pinged_at: float | None = None
        self.notices: list[Notice] = []  # the last tick's

    def tick(self, now: float, queued: list[tuple[str, Parsed]]) -> None:
        causes = judge(self.runner, queued, now, self.runner.scanner.taken)
        self.notices = self.book.reconcile(causes, now, self.config.realert_s, {"parked": self.config.parked_repeat_s})
        for notice in self.notices:
            self._tell(notice)
        self._ping(now)
        self.book.save(self.runner.queue.root, now, force=bool(self.notices))

    def _tell(self, notice: Notice) -> None:
        i = notice.incident
        self.runner.queue.emit(
            notice.at,
            i.jobs[0] if len(i.jobs) == 1 else "-",
            Event.INCIDENT.value,
            what=notice.what,
            id=i.id,
            kind=i.kind,
            text=i.text[:300],
            count=i.count,
            opened=round(i.opened, 3),
        )
        if self.outbox is not None and self.targets:
            self.outbox.notify(self.targets, notice.payload())

    def _ping(self, now: float) -> None:
        if self.outbox is None or self.ping_target is None:
            return
        if self.pinged_at is not None and now - self.pinged_at < self.config.ping_every_s:
            return
        self.pinged_at = now
        self.outbox.ping(self.ping_target, self.state_line(now))

    def state_line(self, now: float) -> str:
        """One line for a ping's body: the open incidents, or that there is none."""
        open_ = [i for i in self.book.open.values() if not i.acked]
        if not open_:
            return f"{self.host}: ok, no open incident"
        return f"{self.host}: {len(open_)} open: " + "; ".join(i.text[:80] for i in open_[:3])

    def ack(self, now: float, target: str, until: float | None, by: str) -> list[Incident]:
        """A `plan ack` request, carried out: every open incident TARGET names is silenced on every channel."""
        if not known_kind(target):
            raise AckRefused(
                f"unknown incident kind in {target!r} (kinds: {', '.join(sorted(CAUSE_KINDS))} or a watch kind)"
            )
        found = self.book.ack(target, until, by, now)
        if not found:
            raise AckRefused(f"no open incident matches {target!r}")
        self.book.save(self.runner.queue.root, now, force=True)
        return found

    def delivery(self) -> dict[str, Any] | None:
        """status.json's `delivery`: where notices go and how that went (None when they go nowhere)."""
        if self.outbox is None:
            return None
        return {
            "notify": [t.shown for t in self.targets],
            "ping": self.ping_target.shown if self.ping_target else None,
            **self.outbox.status(),
        }

    def stop(self, deadline_s: float = 5.0) -> None:
        if self.outbox is not None:
            self.outbox.close(deadline_s)
