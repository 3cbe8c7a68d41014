"""`plan watch`'s loop: probe, judge, alert (hooks, pings, heartbeats) and keep the state file, until stopped."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plancompiler.hosts import Host
from plancompiler.transport import check_timeout
from plancompiler.watch.book import digest, take_box_acks
from plancompiler.watch.incidents import (
    EXIT_CODES,
    Alert,
    reconcile,
)
from plancompiler.watch.judge import Probe, probe
from plancompiler.watch.notify import Sender, is_url
from plancompiler.watch.screen import plural
from plancompiler.watch.state import Rules, WatchState, check_state_file
from runner.durations import format_duration
from runner.readers import terminal_safe


@dataclass(frozen=True)
class WatchOptions:
    interval: float = 120.0
    once: bool = False
    probe_timeout: float = 60.0
    on_alert: str | None = None
    realert: float = 3600.0
    hook_timeout: float = 30.0
    ping: str | None = None
    heartbeat_every: float | None = None
    notify: tuple[str, ...] = ()  # URLs each alert is sent to (watch.notify)


def watch_loop(
    host: Host,
    rules: Rules,
    path: Path,
    options: WatchOptions,
    echo: Callable[[str], None],
    warn: Callable[[str], None],
) -> int:
    """Probe until an alert (its exit code), or forever with --on-alert; --once probes once."""
    check_timeout(options.probe_timeout, "--probe-timeout")  # PlanError: before any probe or state change
    check_state_file(path)  # likewise: a --state that is a device or a FIFO would be replaced by the first save
    sender = None
    if options.notify or (options.ping and is_url(options.ping)):
        sender = Sender(list(options.notify), options.ping, options.hook_timeout)  # NotifyError: before any probe
    try:
        return _loop(host, rules, path, options, echo, warn, sender)
    finally:
        if sender is not None:
            sender.close(options.hook_timeout)  # what was said goes out before the watcher exits


def _loop(
    host: Host,
    rules: Rules,
    path: Path,
    options: WatchOptions,
    echo: Callable[[str], None],
    warn: Callable[[str], None],
    sender: Sender | None,
) -> int:
    while True:
        started = time.monotonic()
        state = WatchState.load(path)  # each time: `plan ack` may have changed it since
        seen = probe(host, state, rules, options.probe_timeout)
        now = time.time()
        state.probed = now
        if seen.note:
            echo(seen.note)
        if seen.skipped:
            # Said once: the offset moves past them with this probe.
            warn(
                terminal_safe(
                    f"plan watch: {host.name}: skipped {plural(len(seen.skipped), 'malformed event')}: "
                    + "; ".join(seen.skipped[:5])
                    + ("; ..." if len(seen.skipped) > 5 else "")
                )
            )
        _take_acks(state, WatchState.load(path))
        take_box_acks(state.incidents, seen.conditions, seen.box_acked, now)
        alerts = seen.events + reconcile(
            state.incidents, seen.conditions, now, {"PARKED": rules.parked_repeat_s}, options.realert, seen.judged
        )
        last_ok, away = state.probed_ok, False
        if state.failures == 0 and seen.judged != frozenset({"UNREACHABLE"}):  # the host answered
            away = last_ok is not None and now - last_ok > max(3 * options.interval, 1.0)
            state.probed_ok = now
        if away and len(alerts) > 1 and last_ok is not None:
            alerts = [digest(alerts, host.name, now - last_ok)]
        if options.heartbeat_every and (
            state.heartbeat_sent is None or now - state.heartbeat_sent >= options.heartbeat_every
        ):
            state.heartbeat_sent = now
            alerts.append(all_clear(host, seen, state, now))
        state.save(path)
        if state.failures == 0 and options.ping and sender is not None and is_url(options.ping):
            sender.ping(all_clear(host, seen, state, now).detail)
        elif state.failures == 0 and options.ping:
            problem = run_hook(options.ping, None, options.hook_timeout)
            if problem:
                warn(f"plan watch: --ping failed: {problem}")
        trouble = [a for a in alerts if EXIT_CODES[a.kind]]
        for alert in alerts:
            echo(terminal_safe(alert.line()))
            if sender is not None and options.notify:
                sender.send(alert, host.name)
            if options.on_alert:
                problem = run_hook(options.on_alert, alert, options.hook_timeout)
                if problem:
                    warn(f"plan watch: --on-alert failed: {problem}")
        if options.once or (trouble and not options.on_alert):
            return EXIT_CODES[trouble[0].kind] if trouble else 0
        time.sleep(max(0.0, options.interval - (time.monotonic() - started)))


def _take_acks(state: WatchState, on_disk: WatchState) -> None:
    """A `plan ack` written while this probe ran (it can take a minute over ssh) is kept, not overwritten."""
    for key, incident in on_disk.incidents.items():
        mine = state.incidents.get(key)
        if mine is not None and incident.acked and incident.opened == mine.opened:
            mine.acked, mine.acked_until = True, incident.acked_until


def all_clear(host: Host, seen: Probe, state: WatchState, now: float) -> Alert:
    """--heartbeat-every's one line: the lanes and the open incidents, so the watcher's silence means it died."""
    lanes = seen.lanes or "lanes not read this probe"
    open_ = sorted(state.incidents.values(), key=lambda i: i.opened)
    names = ", ".join(f"{i.kind} {i.subject} ({format_duration(now - i.opened)})" for i in open_)
    return Alert(
        "OK",
        f"{host.name}: {lanes}; open incidents: {len(open_)}" + (f" ({names})" if names else ""),
        host.name,
        {"open": len(open_)},
    )


def incident_lines(path: Path, now: float | None = None) -> list[str]:
    """`plan watch HOST --incidents`: the open incidents as of the last probe, from the state file."""
    state = WatchState.load(path)
    now = time.time() if now is None else now
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.probed)) if state.probed else "never"
    lines = [f"open incidents as of the last probe ({when}): {len(state.incidents)}"]
    lines += [f"  {i.describe(now)}" for i in sorted(state.incidents.values(), key=lambda i: i.opened)]
    return lines


def run_hook(command: str, alert: Alert | None, timeout: float) -> str | None:
    """Run an --on-alert/--ping command (alert JSON on stdin, kind in PLAN_ALERT_KIND); None if it went well."""
    env = dict(os.environ)
    stdin = b""
    if alert is not None:
        env["PLAN_ALERT_KIND"] = alert.kind
        env["PLAN_ALERT_SUBJECT"] = alert.subject
        stdin = json.dumps(alert.payload()).encode()
    try:
        proc = subprocess.run(["bash", "-c", command], input=stdin, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{command!r} did not finish within {timeout:g}s"
    except OSError as exc:
        return f"{command!r} could not start: {exc}"
    if proc.returncode != 0:
        return f"{command!r} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-200:]}"
    return None
