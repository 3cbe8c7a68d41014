"""One probe of a host and its judgement: the agent's answer read and checked, and the conditions it
shows (dead, stalled, idle, waiting, events)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from plancompiler.errors import AgentError, agent_error
from plancompiler.errors import ControllerDown as ControllerDown  # its home is plancompiler/errors.py
from plancompiler.hosts import Host, RemoteFailed, Unreachable
from plancompiler.watch.args import DEFAULT_EVENTS, WAITING_REASONS
from plancompiler.watch.book import book_conditions, book_of, skew_condition
from plancompiler.watch.incidents import Alert, Condition
from plancompiler.watch.state import Rules, WatchState, host_subject
from runner.durations import format_duration
from runner.readers import status_problem, valid_events
from runner.views.status import runner_down
from runner.vocab import Event, Reason


def fetch_status(host: Host, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """The watcher's one way to a host: the agent's `status` mode (re-point it here when the agent moves); a
    Slurm submit host's answer read by its typed reader, as `plan status` reads it (an AgentError where it is
    malformed)."""
    answer = host.call("status", request, timeout)  # ControllerDown (an Unreachable) where Slurm's controller is
    if host.slurm is None:
        return answer
    from plancompiler.backends.slurmstatus import read_status  # the Slurm records: for Slurm hosts only

    return read_status(answer, host.describe())


@dataclass
class Probe:
    """What one probe saw: one-off EVENT alerts, what is true now, and which kinds it could judge."""

    events: list[Alert] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    judged: frozenset[str] | None = None  # None: every kind
    note: str = ""  # a failed probe's one line
    lanes: str = ""
    skipped: list[str] = field(default_factory=list)  # malformed events.jsonl lines this probe passed over
    box_acked: dict[str, bool] = field(default_factory=dict)  # book incidents (by condition key): acked on the box
    answer: dict[str, Any] | None = None  # the status answer it judged (`plan top` draws it)


_HOST_KINDS = frozenset({"DEAD", "STOPPED", "UNREACHABLE", "ERROR", "SKEW"})


# What `plan status` lists as a job's end.
ENDS = frozenset(
    e.value for e in (Event.DONE, Event.FAILED, Event.SKIPPED, Event.INVALID, Event.CANCELLED, Event.TIMEOUT)
)


def probe(
    host: Host, state: WatchState, rules: Rules, timeout: float | None = None, extra: dict[str, Any] | None = None
) -> Probe:
    """One bounded probe: alerts for what it saw, conditions for what is true, or why it could not see. EXTRA:
    more of the status request (`plan top` asks for the estimates)."""
    subject = host_subject(host)
    sent = time.time()
    try:
        answer = fetch_status(host, {"offset": state.offset, "head": state.head, **(extra or {})}, timeout)
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
    except (RemoteFailed, AgentError) as exc:  # AgentError: an answer of the wrong shape, said where
        state.failures = 0
        return Probe(conditions=[Condition("ERROR", subject, str(exc), "error")], judged=_HOST_KINDS)
    state.failures = 0
    said = agent_error(answer) or _unreadable(answer)
    if said is not None:
        return Probe(
            conditions=[
                Condition("ERROR", subject, f"reached {host.name}, but could not read the queue: {said}", "error")
            ],
            judged=_HOST_KINDS,
        )
    first = state.offset < 0
    state.offset = answer["offset"]
    state.head = answer.get("head", "")
    seen = evaluate(answer, state, rules, replay=not first, host=subject, name=host.name)
    box_now = answer.get("now")
    if isinstance(box_now, (int, float)) and not isinstance(box_now, bool):
        skew = skew_condition(float(box_now), sent, time.time(), subject)
        seen.conditions.extend([skew] if skew else [])
    seen.answer = answer
    return seen


def _unreadable(answer: dict[str, Any]) -> str | None:
    """Why ANSWER (an object: Host.call makes sure) is not a status answer the probe can go on from: its events'
    integer offset; what is inside it is checked where it is read (status_corrupt, checked_events)."""
    offset = answer.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool):
        return "the agent's status answer has no integer 'offset'"
    if not isinstance(answer.get("head", ""), str):
        return "the agent's status answer's 'head' is not a string"
    return None


def evaluate(
    answer: dict[str, Any], state: WatchState, rules: Rules, replay: bool = True, host: str = "host", name: str = ""
) -> Probe:
    """Judge one status answer: new events of the alerting kinds, and every standing state it shows. Where the
    box keeps an incident book, its incidents are the standing states, and only events asked for beyond the
    default ones alert (the book already holds failures, waits and stalls, one per cause)."""
    events, skipped = checked_events(answer)
    result = Probe(skipped=skipped)
    now = answer_now(answer)
    status = answer.get("status")
    book = book_of(answer)
    alerting = set(rules.events) - (set(DEFAULT_EVENTS) if book is not None else set())
    if replay:
        for event in events:
            if event.get("event") in alerting:
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
    stopped = answer.get("runner_stopped") if not answer.get("runner_alive", True) else None
    if isinstance(stopped, dict):
        conditions.extend(_stopped(answer, runner, stopped, host))
    else:
        conditions.extend(_dead(answer, runner, now, rules, host))
    # a dead runner's files are frozen, and a stopped one's: what they say of waits and stalls is not news
    down = isinstance(stopped, dict) or any(c.kind == "DEAD" for c in conditions)
    if book is not None:
        found, result.box_acked = book_conditions(book, name or host, now)
        conditions.extend(found)
        if down:  # a dead (or stopped) runner's book is frozen: its incidents stay as they are
            result.judged = _HOST_KINDS
        result.lanes = lanes_line(status)
        return result
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
    result.lanes = lanes_line(status)
    parked = status.get("parked") or answer.get("parked")
    if parked:
        conditions.append(
            Condition("PARKED", host, parked if isinstance(parked, str) else json.dumps(parked), "parked")
        )
    if down:
        # A dead (or stopped) runner's status.json is frozen: what it says about waiting and idling is not news.
        result.judged = frozenset({"DEAD", "STOPPED", "UNREACHABLE", "ERROR", "PARKED", "BLOCKED", "STALL"})
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


def _stopped(answer: dict[str, Any], runner: dict[str, Any], stopped: dict[str, Any], host: str) -> list[Condition]:
    """A runner that stopped cleanly (its runner-stop is its last word) is not dead; it is news only while work
    waits that no runner will start: STOPPED, with when and why (one incident, keyed by the stop)."""
    counts = answer.get("counts")
    queued = counts.get("queue") if isinstance(counts, dict) else None
    if not isinstance(queued, int) or queued <= 0:
        return []
    return [
        Condition(
            "STOPPED",
            host,
            runner_down({"runner": runner}, stopped, queued).removeprefix("STOPPED: "),  # as plan status says it
            f"stopped:{stopped.get('at')}",
        )
    ]


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


def lanes_line(status: dict[str, Any]) -> str:
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


def _event_text(event: dict[str, Any]) -> str:
    skip = {"ts", "job", "event", "tail"}
    details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in skip)
    tail = event.get("tail")
    if tail:
        details += f", last line: {tail[-1][:120]}"
    return f"{event.get('ts')} {event.get('event')} {event.get('job')} {details}".strip()
