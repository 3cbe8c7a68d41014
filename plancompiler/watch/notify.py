"""`plan watch --notify URL` and `--ping URL`: the watcher's alerts sent as the runner sends its own (a JSON
webhook, ntfy's plain text: runner.alerts.notify), and any other URL through apprise, the optional extra
`plancompiler[notify]` (mail, Slack, Discord, Telegram, Matrix, ...), imported only when such a URL is given."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from plancompiler.diagnostics import PlanError
from plancompiler.watch.incidents import EXIT_CODES, Alert

if TYPE_CHECKING:
    from runner.alerts.notify import Target


class NotifyError(PlanError):
    """A --notify or --ping URL that cannot be used (said before any probe)."""


def is_url(value: str) -> bool:
    return "://" in value


class Sender:
    def __init__(self, urls: list[str], ping: str | None, timeout: float) -> None:
        # urllib, http.client, ssl and threads (~40 ms): loaded by a watcher that sends, not by every `plan`
        # command line (the watch loop, and so this module, is imported with the commands)
        from runner.alerts.notify import BadTarget, Outbox, target

        self.outbox = Outbox(timeout)
        self.targets: list[Target] = []
        others = []
        for url in urls:
            try:
                self.targets.append(target(url))
            except BadTarget:
                others.append(url)
        self.apprise: Any = _apprise(others) if others else None
        self.ping_target: Target | None = None
        if ping is not None and is_url(ping):
            try:
                self.ping_target = target(ping)
            except BadTarget as exc:
                raise NotifyError(f"--ping: {exc}") from exc

    def send(self, alert: Alert, host: str) -> None:
        what = "recovered" if alert.kind == "RECOVERED" else "digest" if alert.kind == "DIGEST" else "open"
        title = f"{alert.kind} on {host}"
        payload = {
            "what": what,
            "title": title,
            "message": alert.line(),
            "host": host,
            "at": time.time(),
            "kind": alert.kind,
            "watch_kind": alert.kind,
            "exit_code": EXIT_CODES.get(alert.kind, 0),
            "alert": alert.payload(),
        }
        if self.targets:
            self.outbox.notify(self.targets, payload)
        if self.apprise is not None:
            apprise, body = self.apprise, alert.line()

            def send() -> None:
                if not apprise.notify(title=title, body=body):
                    raise OSError("apprise could not deliver to every URL")

            self.outbox.call(send, "notify (apprise)")

    def ping(self, body: str) -> None:
        if self.ping_target is not None:
            self.outbox.ping(self.ping_target, body)

    def close(self, deadline_s: float) -> None:
        self.outbox.close(deadline_s)


def _apprise(urls: list[str]) -> Any:
    try:
        import apprise  # the optional extra: only for URLs the runner's own senders do not speak
    except ImportError:
        raise NotifyError(
            f"--notify {urls[0]}: not an http(s):// or ntfy:// URL; for other services install the extra: "
            "pip install 'plancompiler[notify]' (apprise)"
        ) from None
    box = apprise.Apprise()
    for url in urls:
        if not box.add(url):
            raise NotifyError(f"--notify {url}: not a URL apprise knows (see its wiki for the services' URL forms)")
    return box
