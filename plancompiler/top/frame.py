"""`plan top`'s screen, built from what the probes saw: a pure function of the hosts' views, the keys' state and
the clock, to lines (text, style) that fit WIDTH x HEIGHT. The loop (top/app.py) only draws them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from plancompiler.watch import Incident
from runner.durations import format_duration
from runner.readers import stopped_words, terminal_safe
from runner.views.waiting import group_waiting

KEYS = "q quit  j/k select  l log  a ack  r retry  c cancel  / filter"
# Reasons whose group shows when its first job is estimated to start (the others wait on no clock).
_TIMED = ("lane-busy", "order", "exclusive", "requires", "backoff", "stale")
_ENDS = ("done", "failed", "skipped", "invalid", "cancelled", "timeout")


@dataclass(frozen=True)
class HostView:
    """What the probes of one host saw, as of the moment the frame is drawn."""

    name: str
    where: str
    interval: float
    answer: dict[str, Any] | None = None  # the last status answer that came back whole
    answered: float | None = None  # when it came (wall clock)
    probing_since: float | None = None  # a probe in flight since (wall clock)
    failure: str = ""  # why the last probe failed, `KIND: detail` (UNREACHABLE, ERROR); "" when it answered
    incidents: tuple[Incident, ...] = ()
    ends: tuple[dict[str, Any], ...] = ()  # the host's latest end events, oldest first


@dataclass(frozen=True)
class Item:
    """A row the keys can select: an incident, or a job (running, waiting or ended) on one host."""

    kind: str  # incident, running, waiting, ended
    host: int
    key: str  # the incident's KIND:SUBJECT, or the job's file name
    state: str = ""  # a job's state: running, queue, failed, done...


@dataclass
class Ui:
    """The keys' state: the selected row, the filter, a question waiting for y/n, the log shown, a message."""

    selected: int = 0
    filter: str = ""
    typing: bool = False
    confirm: str = ""  # the action awaiting 'y' (retry, cancel)
    message: str = ""
    log: tuple[str, str] | None = None  # (title, text) while a log is shown


@dataclass
class Line:
    text: str
    style: str = ""
    item: int | None = None
    drop: int = 0  # 0: always shown; 1, 2: dropped (2 first) when the screen is too short


@dataclass
class Frame:
    lines: list[Line] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)

    def plain(self) -> str:
        return "\n".join(line.text for line in self.lines)


def clock(at: float, now: float) -> str:
    """A wall-clock time: HH:MM within a day, else the date too."""
    return time.strftime("%H:%M" if abs(at - now) < 20 * 3600 else "%b %d %H:%M", time.localtime(at))


def build(
    views: list[HostView], ui: Ui, now: float, width: int = 80, height: int | None = 24, keys: bool = True
) -> Frame:
    """The frame for VIEWS; HEIGHT None: every line (`--once`, or a screen that is not a terminal); KEYS: the
    keys' line at the foot (a screen that reads no keys has none)."""
    frame = Frame()
    if ui.log is not None:
        return _log_frame(ui.log, ui, width, height)
    title = f"plan top  {time.strftime('%H:%M:%S', time.localtime(now))}  {len(views)} host{'s' * (len(views) != 1)}"
    frame.lines.append(Line(title + ("  filter: " + ui.filter if ui.filter or ui.typing else ""), "bold"))
    for index, view in enumerate(views):
        _host(frame, index, view, ui.filter, now)
    selected = max(0, min(ui.selected, len(frame.items) - 1))
    for line in frame.lines:
        if frame.items and line.item == selected:
            line.style = "reverse"
    footer = [Line(_footer(ui), "dim")] if keys else []
    if ui.message:
        footer.insert(0, Line(ui.message, "yellow"))
    frame.lines = _fit(frame.lines, footer, selected, height)
    for line in frame.lines:
        line.text = _cut(line.text, width)
    return frame


def _footer(ui: Ui) -> str:
    if ui.typing:
        return f"filter: {ui.filter}_  (Enter keeps it, Esc clears it)"
    if ui.confirm:
        return f"{ui.confirm}? press y to confirm, any other key to keep it as it is"
    return KEYS


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _fit(body: list[Line], footer: list[Line], selected: int, height: int | None) -> list[Line]:
    """BODY and FOOTER in HEIGHT lines: details dropped first (never the selected row's), then a window that keeps
    the selected row in view."""
    if height is None:
        return body + footer
    room = max(1, height - len(footer))
    for level in (2, 1):
        if len(body) <= room:
            break
        body = [line for line in body if line.drop < level or line.item == selected]
    if len(body) > room:
        at = next((i for i, line in enumerate(body) if line.item == selected), 0)
        start = max(0, min(at - room // 2, len(body) - room))
        body = body[start : start + room]
    return body + footer


def _host(frame: Frame, index: int, view: HostView, needle: str, now: float) -> None:
    answer = view.answer or {}
    status = answer.get("status") if isinstance(answer.get("status"), dict) else None
    said = answer.get("now") if isinstance(answer.get("now"), (int, float)) else None
    lag = now - view.answered if view.answered is not None else 0.0  # since the answer came
    head, style = _header(view, status, said, lag, now)
    frame.lines.append(Line(head, style))
    for incident in sorted(view.incidents, key=lambda i: (i.acked, i.opened)):
        kind = "incident"
        frame.items.append(Item(kind, index, f"{incident.kind}:{incident.subject}"))
        ack = "  (acked)" if incident.acked else ""
        # the box's failed incident is keyed by its failure's signature (`exited <n>`, numbers and paths masked):
        # a key, not words; its detail says what the jobs said
        shown = "failed" if incident.kind == "EVENT" and incident.subject.startswith("failed:") else incident.subject
        line = f"  ! {incident.kind} {shown} {format_duration(now - incident.opened)}{ack}: {incident.detail}"
        frame.lines.append(
            Line(terminal_safe(line, newlines=False), "dim" if incident.acked else "red", len(frame.items) - 1)
        )
    if status is None:
        return
    estimates = _dict(answer.get("estimates"))
    _lanes(frame, index, status, _dict(estimates.get("running")), needle, (said or now) + lag, now)
    _waiting(frame, index, status, _dict(estimates.get("queued")), needle, (said or now) + lag, now)
    _ended(frame, index, view.ends, needle)


def _header(
    view: HostView, status: dict[str, Any] | None, said: float | None, lag: float, now: float
) -> tuple[str, str]:
    """The host's name (a long path by its end), its state, and where it is last: what is cut is the least read."""
    head, style = _state(view, status, said, lag, now)
    name = view.name if len(view.name) <= 24 else "…" + view.name[-23:]
    where = f"  [{view.where}]" if view.where not in (view.name, name) else ""
    return f"{name}  {head}{where}", style


def _state(
    view: HostView, status: dict[str, Any] | None, said: float | None, lag: float, now: float
) -> tuple[str, str]:
    silent = view.probing_since is not None and now - view.probing_since >= view.interval
    if view.answer is None:
        if view.failure:
            return view.failure, "bold red"
        if silent:
            return f"NO ANSWER for {format_duration(now - (view.probing_since or now))}", "bold red"
        return "probing...", "bold"
    age = format_duration(lag)
    if view.failure or silent:
        why = view.failure or f"probe running {format_duration(now - (view.probing_since or now))}"
        return f"NO ANSWER for {age} ({why}); as it was then:", "bold red"
    if status is None:
        error = (view.answer or {}).get("status_error")
        return f"{error or 'no runner has ever ticked here (no status.json)'}", "bold red"
    runner = _dict(status.get("runner"))
    beat = float(runner.get("heartbeat") or 0)
    beat_age = (said if said is not None else now) - beat + lag
    counts = _dict((view.answer or {}).get("counts")) or _dict(status.get("counts"))  # the agent's: counted now
    count = " ".join(f"{k[0]}{counts[k]}" for k in ("queue", "running", "done", "failed") if k in counts)
    alive = (view.answer or {}).get("runner_alive", True)
    stopped = None if alive else stopped_words((view.answer or {}).get("runner_stopped"))
    parked = "  PARKED" if status.get("parked") else ""
    if stopped is not None:  # stopped cleanly: its last heartbeat's age says nothing more
        return f"runner {runner.get('pid')} {stopped}{parked}  {count}", "bold"
    who = f"runner {runner.get('pid')}" if alive else f"runner {runner.get('pid')} NOT RUNNING"
    style = "bold red" if not alive or beat_age > 300 else "bold"
    return f"{who}  beat {format_duration(beat_age)} ago{parked}  {count}", style


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _matches(job: str, needle: str) -> bool:
    return not needle or needle.lower() in job.lower()


def _lanes(
    frame: Frame,
    index: int,
    status: dict[str, Any],
    ends: dict[str, Any],
    needle: str,
    host_now: float,
    now: float,
) -> None:
    lanes = _dict(status.get("lanes"))
    running: dict[str, list[dict[str, Any]]] = {}
    for run in status.get("running") or []:
        if isinstance(run, dict) and isinstance(run.get("job"), str):
            running.setdefault(str(run.get("lane")), []).append(run)
    order = [*(status.get("lane_order") or []), *sorted(set(lanes) | set(running))]
    for lane in dict.fromkeys(order):
        view = _dict(lanes.get(lane))
        runs = [r for r in running.get(lane, []) if _matches(r["job"], needle)]
        found = view.get("slots")
        slots = found if isinstance(found, int) else 1
        why = f" ({view.get('reason')}: {view.get('blocker')})" if view.get("reason") else ""
        if slots > 1:  # what holds its free slots, where none is in use (a pending install, an exclusive job)
            busy = len(running.get(lane, []))
            frame.lines.append(
                Line(terminal_safe(f"  {lane:<4} {busy}/{slots} slots busy{why if not busy else ''}", False))
            )
        elif not running.get(lane):
            frame.lines.append(Line(terminal_safe(f"  {lane:<4} {view.get('state', 'idle')}{why}", False), "dim"))
        for run in runs:
            frame.items.append(Item("running", index, run["job"], "running"))
            item = len(frame.items) - 1
            started = run.get("started")
            elapsed = (
                host_now - float(started) if isinstance(started, (int, float)) else float(run.get("elapsed_s") or 0)
            )
            progress = str(run.get("progress") or "")
            estimate = _dict(ends.get(run["job"]))
            end = estimate.get("ends")
            eta = f"  ends ~{clock(float(end) + (now - host_now), now)} (est.)" if isinstance(end, (int, float)) else ""
            main = f"  {lane if slots == 1 else '':<4} {run['job']}  {format_duration(elapsed)}"
            main += f"  {_progress_pct(progress)}" if progress else ""
            frame.lines.append(Line(terminal_safe(main + eta, False), "green", item))
            basis = f"est.: {estimate['basis']}" if estimate.get("basis") and end is not None else ""
            last = f"| {run.get('last_line')}" if run.get("last_line") else ""
            detail = "  ".join(x for x in (basis, last) if x)
            if detail:
                frame.lines.append(Line(terminal_safe(f"       {detail}", False), "dim", item, drop=2))


def _progress_pct(progress: str) -> str:
    """The progress's share (`64%`) where it has one, else its first words."""
    head = progress.split()[0] if progress.split() else ""
    return head if head.endswith("%") else progress[:24]


def _waiting(
    frame: Frame,
    index: int,
    status: dict[str, Any],
    starts: dict[str, Any],
    needle: str,
    host_now: float,
    now: float,
) -> None:
    queued = [q for q in status.get("queued") or [] if isinstance(q, dict) and _matches(str(q.get("job")), needle)]
    if not queued:
        return
    frame.lines.append(Line(f"  waiting {len(queued)}:"))
    for n, group in enumerate(group_waiting(queued, host_now)):
        # the row stands for the job estimated to start first, else the one that has waited longest
        timed = [w for w in group.oldest if isinstance(_dict(starts.get(w.job)).get("starts"), (int, float))]
        first = min(timed, key=lambda w: _dict(starts.get(w.job))["starts"]) if timed else group.oldest[0]
        frame.items.append(Item("waiting", index, first.job, "queue"))
        item = len(frame.items) - 1
        since = f"  oldest {format_duration(host_now - group.oldest[0].since)}"
        what = group.blocker if group.reason in ("lane-busy", "exclusive") else (first.detail or group.blocker)
        what = f"e.g. {what}" if not group.blocker and group.count > 1 and what else what
        jobs = first.job if group.count == 1 else f"{first.job} +{group.count - 1}"
        estimate = _dict(starts.get(first.job))
        at = estimate.get("starts")
        known = group.reason in _TIMED and isinstance(at, (int, float))
        when = f"  starts ~{clock(at + (now - host_now), now)} (est.)" if isinstance(at, (int, float)) and known else ""
        text = f"    {group.reason:<10}{group.count:>4}  {jobs}{when}{since}  {what}"
        style = "yellow" if group.reason == "blocked" else ""
        frame.lines.append(Line(terminal_safe(text, False), style, item, drop=int(n >= 3)))
        if known and estimate.get("basis"):
            frame.lines.append(Line(terminal_safe(f"       est.: {estimate['basis']}", False), "dim", item, drop=2))


def _ended(frame: Frame, index: int, ends: tuple[dict[str, Any], ...], needle: str) -> None:
    shown = [e for e in ends if _matches(str(e.get("job")), needle)][-3:]
    for event in reversed(shown):
        kind = str(event.get("event"))
        state = "done" if kind in ("done", "skipped") else "failed"
        frame.items.append(Item("ended", index, str(event.get("job")), state))
        rc = f" rc {event['rc']}" if "rc" in event else ""
        text = f"  ended {kind:<9} {event.get('job')}  {str(event.get('ts', ''))[11:16]}{rc}"
        frame.lines.append(
            Line(terminal_safe(text, False), "red" if state == "failed" else "dim", len(frame.items) - 1, drop=1)
        )


def _log_frame(log: tuple[str, str], ui: Ui, width: int, height: int | None) -> Frame:
    title, text = log
    lines = [Line(_cut(title, width), "bold")]
    body = terminal_safe(text).splitlines()
    room = (height - 2) if height else len(body)
    lines += [Line(_cut(line, width)) for line in body[-room:]]
    lines.append(Line(_cut(ui.message or "q or Esc: back", width), "dim"))
    return Frame(lines)


def is_end(event: dict[str, Any]) -> bool:
    return event.get("event") in _ENDS
