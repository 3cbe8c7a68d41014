"""`plan status` and `plan watch`: one bounded probe of a host's queue, turned into a view or alerts."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plancompiler.hosts import Host, RemoteFailed, Unreachable
from runner.durations import format_duration
from runner.queue import atomic_write
from runner.status import render_status

DEFAULT_EVENTS = ("failed", "retry", "gpu-wait", "requires-wait", "blocked", "invalid", "timeout", "stalled",
                  "long-running", "orphans-killed", "correlated-failure", "idle")
# Exit codes of `plan watch`, one per kind; the first alert of a probe decides.
EXIT_CODES = {"EVENT": 10, "STALL": 11, "IDLE": 12, "BLOCKED": 13, "DEAD": 14, "UNREACHABLE": 15, "ERROR": 16,
              "PARKED": 17}


@dataclass(frozen=True)
class Alert:
    kind: str
    detail: str
    key: str  # what makes two alerts "the same" for --realert

    def line(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Rules:
    events: tuple[str, ...] = DEFAULT_EVENTS
    net_stall_s: float = 3600.0
    idle_s: float = 600.0
    dead_s: float = 300.0
    unreachable_n: int = 5
    parked_repeat_s: float = 7200.0


@dataclass
class WatchState:
    """Kept per host between probes and restarts, so old events are never replayed."""

    offset: int = -1
    head: str = ""  # fingerprint of the events file's first bytes: a rotated file has another
    failures: int = 0
    idle_since: float | None = None
    parked_alerted: float | None = None
    alerted: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> WatchState:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            return cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(asdict(self)).encode())


def state_path(host: Host) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    ident = hashlib.sha1(f"{host.ssh}:{host.root}".encode()).hexdigest()[:12]
    return Path(base) / "plancompiler" / f"watch-{host.name.replace('/', '_')[-40:]}-{ident}.json"


def probe(host: Host, state: WatchState, rules: Rules, timeout: float | None = None) -> list[Alert]:
    """One bounded probe: alerts for what it saw, or for what it could not see."""
    try:
        answer = host.call("status", {"offset": state.offset, "head": state.head}, timeout)
    except Unreachable as exc:
        state.failures += 1
        if state.failures >= rules.unreachable_n:
            return [Alert("UNREACHABLE", f"{state.failures} probes in a row failed; last: {exc}", "UNREACHABLE")]
        return []
    except RemoteFailed as exc:
        state.failures = 0
        return [Alert("ERROR", str(exc), "ERROR")]
    state.failures = 0
    if "error" in answer:
        return [Alert("ERROR", f"reached {host.name}, but could not read the queue: {answer['error']}", "ERROR")]
    first = state.offset < 0
    state.offset = answer["offset"]
    state.head = answer.get("head", "")
    return evaluate(answer, state, rules, replay=not first, host=host.name)


def evaluate(answer: dict[str, Any], state: WatchState, rules: Rules, replay: bool = True,
             host: str = "host") -> list[Alert]:
    alerts: list[Alert] = []
    now = float(answer.get("now", time.time()))
    status = answer.get("status")
    if replay:
        for event in answer.get("events", []):
            if event.get("event") in rules.events:
                alerts.append(Alert("EVENT", _event_text(event), f"EVENT:{json.dumps(event, sort_keys=True)}"))
    if status is None:
        alerts.append(Alert("DEAD", f"no runner has ever ticked on {host} (no status.json)", "DEAD"))
        return alerts
    runner = status.get("runner", {})
    beat = now - float(runner.get("heartbeat", 0))
    if beat > rules.dead_s:
        alerts.append(Alert("DEAD", f"runner heartbeat is {format_duration(beat)} old", "DEAD"))
    elif not answer.get("runner_alive", True):
        alerts.append(Alert("DEAD", f"runner pid {runner.get('pid')} is not running", "DEAD"))
    running = status.get("running", [])
    for run in running:
        elapsed = float(run.get("elapsed_s", 0)) + max(0.0, now - float(runner.get("heartbeat", now)))
        warn = run.get("warn_after_s")
        if run.get("lane") == "net" and elapsed > rules.net_stall_s:
            alerts.append(Alert("STALL", f"net job {run['job']} running for {format_duration(elapsed)}: "
                                f"{run.get('last_line', '')[:120]}", f"STALL:{run['job']}"))
        elif warn and elapsed > float(warn):
            alerts.append(Alert("STALL", f"{run['job']} past its WARN_AFTER ({format_duration(float(warn))}): "
                                f"running {format_duration(elapsed)}", f"STALL:{run['job']}"))
    queued = status.get("queued", [])
    for item in queued:
        if item.get("reason") == "blocked":
            alerts.append(Alert("BLOCKED", f"{item['job']} can never run: {item.get('detail', '')}",
                                f"BLOCKED:{item['job']}"))
    parked = status.get("parked") or answer.get("parked")
    if running:
        state.idle_since = None
    else:
        state.idle_since = state.idle_since if state.idle_since is not None else now
    if parked:
        if state.parked_alerted is None or now - state.parked_alerted >= rules.parked_repeat_s:
            state.parked_alerted = now
            alerts.append(Alert("PARKED", f"{parked if isinstance(parked, str) else json.dumps(parked)}",
                                f"PARKED:{now}"))
        return alerts
    state.parked_alerted = None
    if state.idle_since is not None and now - state.idle_since >= rules.idle_s:
        idle = format_duration(now - state.idle_since)
        if queued:
            why = "; ".join(f"{q['job']}: {q['reason']} {q.get('detail', '')}".strip() for q in queued[:5])
            alerts.append(Alert("IDLE", f"nothing running for {idle}, {len(queued)} queued: {why}", "IDLE"))
        else:
            alerts.append(Alert("IDLE", f"nothing running for {idle}, nothing queued", "IDLE"))
    return alerts


@dataclass(frozen=True)
class WatchOptions:
    interval: float = 120.0
    once: bool = False
    probe_timeout: float = 60.0
    on_alert: str | None = None
    realert: float = 3600.0
    hook_timeout: float = 30.0
    ping: str | None = None


def watch_loop(host: Host, rules: Rules, path: Path, options: WatchOptions, echo: Callable[[str], None],
               warn: Callable[[str], None]) -> int:
    """Probe until an alert (its exit code), or forever with --on-alert; --once probes once."""
    state = WatchState.load(path)
    while True:
        started = time.monotonic()
        alerts = probe(host, state, rules, options.probe_timeout)
        state.save(path)
        if state.failures == 0 and options.ping:
            problem = run_hook(options.ping, None, options.hook_timeout)
            if problem:
                warn(f"plan watch: --ping failed: {problem}")
        if alerts and not options.on_alert:
            for alert in alerts:
                echo(alert.line())
            return EXIT_CODES[alerts[0].kind]
        now = time.time()
        for alert in alerts:
            last = state.alerted.get(alert.key)
            if last is not None and now - last < options.realert:
                continue
            state.alerted[alert.key] = now
            echo(alert.line())
            problem = run_hook(options.on_alert or "", alert, options.hook_timeout)
            if problem:
                warn(f"plan watch: --on-alert failed: {problem}")
        state.alerted = {k: v for k, v in state.alerted.items() if now - v < options.realert}
        state.save(path)
        if options.once:
            return EXIT_CODES[alerts[0].kind] if alerts else 0
        time.sleep(max(0.0, options.interval - (time.monotonic() - started)))


def _event_text(event: dict[str, Any]) -> str:
    skip = {"ts", "job", "event", "tail"}
    details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in skip)
    tail = event.get("tail")
    if tail:
        details += f", last line: {tail[-1][:120]}"
    return f"{event['ts']} {event['event']} {event.get('job')} {details}".strip()


def run_hook(command: str, alert: Alert | None, timeout: float) -> str | None:
    """Run an --on-alert/--ping command (alert JSON on stdin, kind in PLAN_ALERT_KIND); None if it went well."""
    env = dict(os.environ)
    stdin = b""
    if alert is not None:
        env["PLAN_ALERT_KIND"] = alert.kind
        stdin = json.dumps({"kind": alert.kind, "detail": alert.detail}).encode()
    try:
        proc = subprocess.run(["bash", "-c", command], input=stdin, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{command!r} did not finish within {timeout:g}s"
    except OSError as exc:
        return f"{command!r} could not start: {exc}"
    if proc.returncode != 0:
        return f"{command!r} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-200:]}"
    return None


def status_text(host: Host, answer: dict[str, Any]) -> str:
    status = answer.get("status")
    now = float(answer.get("now", time.time()))
    if status is None:
        counts = answer.get("counts", {})
        return (f"{host.describe()}: no runner has ever ticked here (no status.json); jobs: "
                + "  ".join(f"{k} {v}" for k, v in counts.items()))
    for run in status.get("running", []):
        tail = answer.get("logs", {}).get(run["job"], {}).get("tail", "")
        from runner.progress import parse_progress

        progress = parse_progress(tail)
        if progress:
            run["progress"] = progress
    text = render_status(status, now)
    if not answer.get("runner_alive", True):
        text = f"DEAD: runner pid {status.get('runner', {}).get('pid')} is not running\n" + text
    ends = [e for e in answer.get("events", []) if e.get("event") in ("done", "failed", "skipped", "invalid")]
    if ends:
        text += "\n\nrecent ends:\n" + "\n".join(
            f"  {e['ts']}  {e['event']:<8} {e['job']}" + (f"  rc {e['rc']}" if "rc" in e else "") for e in ends[-8:])
    return text
