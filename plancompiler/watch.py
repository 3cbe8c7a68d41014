"""`plan status` and `plan watch`: one bounded probe of a host's queue, judged as events and standing states."""

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
from plancompiler.incidents import EXIT_CODES, Alert, Condition, Incident, dump_incidents, load_incidents, reconcile
from plancompiler.transport import check_timeout
from plancompiler.watch_args import DEFAULT_EVENTS, WAITING_REASONS
from runner.durations import format_duration
from runner.files import atomic_write
from runner.readers import status_problem, terminal_safe, valid_events
from runner.status import render_status
from runner.vocab import Event, Reason

__all__ = ["DEFAULT_EVENTS", "EXIT_CODES", "Alert"]


@dataclass(frozen=True)
class Rules:
    events: tuple[str, ...] = DEFAULT_EVENTS
    net_stall_s: float = 3600.0
    idle_s: float = 600.0
    dead_s: float = 300.0
    unreachable_n: int = 5
    parked_repeat_s: float = 7200.0
    waiting_s: float = 1800.0
    waiting_by_reason: dict[str, float] = field(default_factory=dict)

    def waiting_limit(self, reason: str) -> float:
        return self.waiting_by_reason.get(reason, self.waiting_s)


@dataclass
class WatchState:
    """Kept per host between probes and restarts: the event offset, counters and the open incidents."""

    offset: int = -1
    head: str = ""  # fingerprint of the events file's first bytes: a rotated file has another
    failures: int = 0
    idle_since: float | None = None
    # "job\treason\tblocker" -> when this watcher first saw it (Slurm's squeue has no such time)
    waiting_seen: dict[str, float] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    heartbeat_sent: float | None = None
    probed: float | None = None

    @classmethod
    def load(cls, path: Path) -> WatchState:
        try:
            data = json.loads(path.read_text())
            values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            values["incidents"] = load_incidents(values.get("incidents"))
            return cls(**values)
        except (OSError, ValueError, TypeError, AttributeError):
            return cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self) | {"incidents": dump_incidents(self.incidents)}
        atomic_write(path, json.dumps(data).encode())


def state_path(host: Host) -> Path:
    """The watcher's state file for HOST's queue: keyed by where the queue is (a local root by its resolved
    path, a remote one by destination and root), not by how the command line spelt it, so `plan ack` given
    ./q, /abs/q or a hosts-file name finds the incidents `plan watch` opened under another spelling."""
    base = Path(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")) / "plancompiler"
    root = os.path.realpath(os.path.expanduser(host.root)) if host.local else host.root
    label = os.path.basename(root.rstrip("/")) if host.local else str(host.ssh)
    ident = hashlib.sha1(f"{host.ssh}:{root}".encode()).hexdigest()[:12]
    path = base / f"watch-{label.replace('/', '_')[-40:] or 'root'}-{ident}.json"
    legacy = (
        base / f"watch-{host.name.replace('/', '_')[-40:]}-"
        f"{hashlib.sha1(f'{host.ssh}:{host.root}'.encode()).hexdigest()[:12]}.json"
    )
    if legacy != path and legacy.exists() and not path.exists():
        try:  # a state file named the old way (by the spelling): carried over once, its incidents kept
            legacy.rename(path)
        except OSError:
            return legacy
    return path


def host_subject(host: Host) -> str:
    """What a host's incidents are about: a local queue by its resolved root (however it was spelt), else the
    host's name."""
    if host.local and host.backend == "queue":
        return os.path.realpath(os.path.expanduser(host.root))
    return host.name


class ControllerDown(Exception):
    """On Slurm: the submit host answered, its controller did not. The controller is the runner there."""


_CONTROLLER_DOWN = "the Slurm controller did not answer"


def fetch_status(host: Host, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """The watcher's one way to a host: the agent's `status` mode (re-point it here when the agent moves)."""
    try:
        return host.call("status", request, timeout)
    except Unreachable as exc:
        if host.backend == "slurm" and _CONTROLLER_DOWN in str(exc):
            raise ControllerDown(str(exc)) from exc
        raise


@dataclass
class Probe:
    """What one probe saw: one-off EVENT alerts, what is true now, and which kinds it could judge."""

    events: list[Alert] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    judged: frozenset[str] | None = None  # None: every kind
    note: str = ""  # a failed probe's one line
    lanes: str = ""
    skipped: list[str] = field(default_factory=list)  # malformed events.jsonl lines this probe passed over


_HOST_KINDS = frozenset({"DEAD", "UNREACHABLE", "ERROR"})
# What `plan status` lists as a job's end.
_ENDS = frozenset(
    e.value for e in (Event.DONE, Event.FAILED, Event.SKIPPED, Event.INVALID, Event.CANCELLED, Event.TIMEOUT)
)


def probe(host: Host, state: WatchState, rules: Rules, timeout: float | None = None) -> Probe:
    """One bounded probe: alerts for what it saw, conditions for what is true, or why it could not see."""
    subject = host_subject(host)
    try:
        answer = fetch_status(host, {"offset": state.offset, "head": state.head}, timeout)
    except ControllerDown as exc:
        state.failures = 0
        return Probe(
            conditions=[
                Condition(
                    "DEAD",
                    subject,
                    f"{host.name}: the submit host answers but its Slurm controller does not: {exc}",
                    "controller",
                )
            ],
            judged=_HOST_KINDS,
        )
    except Unreachable as exc:
        state.failures += 1
        if state.failures >= rules.unreachable_n:
            return Probe(
                conditions=[
                    Condition(
                        "UNREACHABLE", subject, f"{state.failures} probes in a row failed; last: {exc}", "unreachable"
                    )
                ],
                judged=frozenset({"UNREACHABLE"}),
            )
        return Probe(judged=frozenset(), note=f"probe failed ({state.failures}/{rules.unreachable_n}): {exc}")
    except RemoteFailed as exc:
        state.failures = 0
        return Probe(conditions=[Condition("ERROR", subject, str(exc), "error")], judged=_HOST_KINDS)
    state.failures = 0
    if "error" in answer:
        return Probe(
            conditions=[
                Condition(
                    "ERROR", subject, f"reached {host.name}, but could not read the queue: {answer['error']}", "error"
                )
            ],
            judged=_HOST_KINDS,
        )
    first = state.offset < 0
    state.offset = answer["offset"]
    state.head = answer.get("head", "")
    return evaluate(answer, state, rules, replay=not first, host=subject)


def evaluate(answer: dict[str, Any], state: WatchState, rules: Rules, replay: bool = True, host: str = "host") -> Probe:
    """Judge one status answer: new events of the alerting kinds, and every standing state it shows."""
    events, skipped = checked_events(answer)
    result = Probe(skipped=skipped)
    now = answer_now(answer)
    status = answer.get("status")
    if replay:
        for event in events:
            if event.get("event") in rules.events:
                result.events.append(Alert("EVENT", _event_text(event), str(event.get("job", "-")), {"event": event}))
    conditions = result.conditions
    corrupt = status_corrupt(answer)
    if corrupt:
        conditions.append(Condition("ERROR", host, f"reached {host}, but its {corrupt}", "status-corrupt"))
        result.judged = _HOST_KINDS
        return result
    if status is None:
        conditions.append(Condition("DEAD", host, f"no runner has ever ticked on {host} (no status.json)", "never"))
        result.judged = _HOST_KINDS
        return result
    runner = status.get("runner") or {}
    dead = _dead(answer, runner, now, rules, host)
    conditions.extend(dead)
    running = status.get("running") or []
    conditions.extend(_stalled(running, runner, now, rules))
    queued = status.get("queued") or []
    conditions.extend(
        Condition(
            "BLOCKED",
            item["job"],
            f"{item['job']} can never run: {item.get('detail', '')}",
            f"{item.get('blocker')}:{item.get('detail')}",
        )
        for item in queued
        if item.get("reason") == Reason.BLOCKED
    )
    result.lanes = _lanes_line(status)
    parked = status.get("parked") or answer.get("parked")
    if parked:
        conditions.append(
            Condition("PARKED", host, parked if isinstance(parked, str) else json.dumps(parked), "parked")
        )
    if dead:
        # A dead runner's status.json is frozen: what it says about waiting and idling is not news.
        result.judged = frozenset({"DEAD", "UNREACHABLE", "ERROR", "PARKED", "BLOCKED", "STALL"})
        return result
    conditions.extend(_waiting(queued, state, rules, now))
    if running:
        state.idle_since = None
    else:
        state.idle_since = state.idle_since if state.idle_since is not None else now
    if not parked and state.idle_since is not None:
        conditions.extend(_idle(status, queued, state.idle_since, now, rules, host))
    return result


def _dead(answer: dict[str, Any], runner: dict[str, Any], now: float, rules: Rules, host: str) -> list[Condition]:
    beat = now - float(runner.get("heartbeat", 0) or 0)
    if beat > rules.dead_s:
        return [Condition("DEAD", host, f"runner heartbeat is {format_duration(beat)} old", "dead")]
    if not answer.get("runner_alive", True):
        return [Condition("DEAD", host, f"runner pid {runner.get('pid')} is not running", "dead")]
    return []


def _stalled(running: list[dict[str, Any]], runner: dict[str, Any], now: float, rules: Rules) -> list[Condition]:
    """Running jobs past the net stall limit or their own WARN_AFTER."""
    found = []
    for run in running:
        elapsed = float(run.get("elapsed_s", 0)) + max(0.0, now - float(runner.get("heartbeat", now) or now))
        warn = run.get("warn_after_s")
        if run.get("lane") == "net" and elapsed > rules.net_stall_s:
            found.append(
                Condition(
                    "STALL",
                    run["job"],
                    f"net job {run['job']} running for {format_duration(elapsed)}: {run.get('last_line', '')[:120]}",
                    "net",
                )
            )
        elif warn and elapsed > float(warn):
            found.append(
                Condition(
                    "STALL",
                    run["job"],
                    f"{run['job']} past its WARN_AFTER "
                    f"({format_duration(float(warn))}): running {format_duration(elapsed)}",
                    "warn-after",
                )
            )
    return found


def _idle(
    status: dict[str, Any], queued: list[dict[str, Any]], idle_since: float, now: float, rules: Rules, host: str
) -> list[Condition]:
    """Nothing running for the idle limit (counted from the lanes' last change, as the runner knows it)."""
    # The runner knows when each lane last changed: a watcher started now counts from there.
    lane_since = [float(v["since"]) for v in (status.get("lanes") or {}).values() if v.get("since") is not None]
    since = min(idle_since, max(lane_since)) if lane_since else idle_since
    if now - since < rules.idle_s:
        return []
    idle = format_duration(now - since)
    if queued:
        why = "; ".join(f"{q['job']}: {q['reason']} {q.get('detail', '')}".strip() for q in queued[:5])
        return [Condition("IDLE", host, f"nothing running for {idle}, {len(queued)} queued: {why}", "idle")]
    return [Condition("IDLE", host, f"nothing running for {idle}, nothing queued", "idle")]


def checked_events(answer: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The answer's events that are well-formed, and a line for each malformed one it or the host skipped."""
    raw = answer.get("events")
    events, skipped = valid_events(raw if isinstance(raw, list) else [], "event")
    said = answer.get("skipped")
    lines = [line for line in said if isinstance(line, str)] if isinstance(said, list) else []
    return events, lines + skipped


def status_corrupt(answer: dict[str, Any]) -> str | None:
    """Why the answer's status.json is unusable (it exists but is corrupt), or None."""
    said = answer.get("status_error")
    if said:
        return str(said)
    status = answer.get("status")
    problem = status_problem(status) if status is not None else None
    return f"status.json is corrupt: {problem}" if problem else None


def answer_now(answer: dict[str, Any]) -> float:
    now = answer.get("now")
    return float(now) if isinstance(now, (int, float)) and not isinstance(now, bool) else time.time()


def _waiting(queued: list[dict[str, Any]], state: WatchState, rules: Rules, now: float) -> list[Condition]:
    conditions, seen = [], {}
    for item in queued:
        reason = item.get("reason", "")
        if reason not in WAITING_REASONS:
            continue
        key = f"{item['job']}\t{reason}\t{item.get('blocker', '')}"
        seen[key] = state.waiting_seen.get(key, now)
        since = seen[key] if item.get("since") is None else min(seen[key], float(item["since"]))
        if now - since > rules.waiting_limit(reason):
            detail = f" {item['detail']}" if item.get("detail") else ""
            conditions.append(
                Condition(
                    "WAITING",
                    item["job"],
                    f"{item['job']} has waited {format_duration(now - since)} on {reason}:{detail}",
                    f"{reason}:{item.get('blocker', '')}",
                )
            )
    state.waiting_seen = seen
    return conditions


def _lanes_line(status: dict[str, Any]) -> str:
    lanes = status.get("lanes") or {}
    running: dict[str, list[str]] = {}  # every running job of a lane, not the last one seen
    for run in status.get("running", []):
        running.setdefault(str(run.get("lane")), []).append(str(run.get("job")))
    parts = []
    for lane in status.get("lane_order") or sorted(lanes):
        view = lanes.get(lane, {})
        state = view.get("state", "?")
        what = " + ".join(running.get(lane, [])) or (view.get("reason") or "")
        slots = view.get("slots") or 1
        if isinstance(slots, int) and slots > 1:  # a lane of several slots: how many are in use
            state = f"{view.get('busy', 0)}/{slots} slots busy"
        elif len(running.get(lane, [])) > 1:  # a Slurm lane without a licence count: how many run
            state = f"{len(running[lane])} running"
        parts.append(f"{lane} {state}" + (f" ({what})" if what else ""))
    if not parts and status.get("running") is not None:
        parts.append(f"{len(status.get('running', []))} running, {len(status.get('queued', []))} queued")
    return ", ".join(parts)


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
                    f"plan watch: {host.name}: skipped {_count(len(seen.skipped), 'malformed event')}: "
                    + "; ".join(seen.skipped[:5])
                    + ("; ..." if len(seen.skipped) > 5 else "")
                )
            )
        _take_acks(state, WatchState.load(path))
        alerts = seen.events + reconcile(
            state.incidents, seen.conditions, now, {"PARKED": rules.parked_repeat_s}, options.realert, seen.judged
        )
        if options.heartbeat_every and (
            state.heartbeat_sent is None or now - state.heartbeat_sent >= options.heartbeat_every
        ):
            state.heartbeat_sent = now
            alerts.append(all_clear(host, seen, state, now))
        state.save(path)
        if state.failures == 0 and options.ping:
            problem = run_hook(options.ping, None, options.hook_timeout)
            if problem:
                warn(f"plan watch: --ping failed: {problem}")
        trouble = [a for a in alerts if EXIT_CODES[a.kind]]
        for alert in alerts:
            echo(terminal_safe(alert.line()))
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


def _event_text(event: dict[str, Any]) -> str:
    skip = {"ts", "job", "event", "tail"}
    details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in skip)
    tail = event.get("tail")
    if tail:
        details += f", last line: {tail[-1][:120]}"
    return f"{event.get('ts')} {event.get('event')} {event.get('job')} {details}".strip()


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


def status_text(host: Host, answer: dict[str, Any]) -> str:
    """`plan status`'s screen, made safe for a terminal: job output can hold escape sequences."""
    return terminal_safe(_status_text(host, answer))


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _add_progress(status: dict[str, Any], answer: dict[str, Any]) -> None:
    """Each running job's progress, as its log's tail shows it, into STATUS for render_status."""
    logs: dict[str, Any] = answer["logs"] if isinstance(answer.get("logs"), dict) else {}
    for run in status.get("running") or []:
        log = logs.get(run["job"])
        tail = log.get("tail") if isinstance(log, dict) else None
        from runner.progress import parse_progress

        progress = parse_progress(tail) if isinstance(tail, str) else None
        if progress:
            run["progress"] = progress


def _status_text(host: Host, answer: dict[str, Any]) -> str:
    events, skipped = checked_events(answer)
    note = (
        (
            f"\n\nskipped {_count(len(skipped), 'malformed event')}: "
            + "; ".join(skipped[:5])
            + ("; ..." if len(skipped) > 5 else "")
        )
        if skipped
        else ""
    )
    now = answer_now(answer)
    corrupt = status_corrupt(answer)
    status = None if corrupt else answer.get("status")
    counts: dict[str, Any] = answer["counts"] if isinstance(answer.get("counts"), dict) else {}
    if status is None:
        why = f"its {corrupt}" if corrupt else "no runner has ever ticked here (no status.json)"
        return f"{host.describe()}: {why}; jobs: " + "  ".join(f"{k} {v}" for k, v in counts.items()) + note
    _add_progress(status, answer)
    text = render_status(status, now)
    if not answer.get("runner_alive", True):
        text = f"DEAD: runner pid {(status.get('runner') or {}).get('pid')} is not running\n" + text
    ends = [e for e in events if e.get("event") in _ENDS]
    if ends:
        text += "\n\nrecent ends:\n" + "\n".join(
            f"  {e['ts']}  {e['event']:<8} {e['job']}" + (f"  rc {e['rc']}" if "rc" in e else "") for e in ends[-8:]
        )
    return text + note
