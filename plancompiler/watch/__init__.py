"""`plan status` and `plan watch`: one bounded probe of a host's queue, judged as events and standing states.

state (rules and the state file), judge (a probe and its conditions), book (the box's incident book read as
conditions, SKEW, the DIGEST), incidents (one incident per cause, acks), screen (`plan status`'s text), loop
(`plan watch`'s loop and hooks), args (its options). This is the door: the rest of plancompiler imports the
names below, from `plancompiler.watch`; each part is imported when one of its names is first asked for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plancompiler.watch.args import (
        ALERTABLE_EVENTS,
        DEFAULT_EVENTS,
        WAITING_REASONS,
        duration,
        event_names,
        waiting_limits,
    )
    from plancompiler.watch.book import book_of, skew_condition, take_box_acks
    from plancompiler.watch.history import HistoryError, check_outcome
    from plancompiler.watch.history import select as history_ends
    from plancompiler.watch.history import text as history_text
    from plancompiler.watch.history import to_json as history_json
    from plancompiler.watch.incidents import (
        EXIT_CODES,
        INCIDENT_KINDS,
        AckError,
        Alert,
        Condition,
        Incident,
        ack,
        reconcile,
    )
    from plancompiler.watch.judge import ControllerDown, Probe, evaluate, fetch_status, probe
    from plancompiler.watch.loop import WatchOptions, incident_lines, run_hook, watch_loop
    from plancompiler.watch.screen import status_text
    from plancompiler.watch.state import Rules, WatchState, acknowledge, host_subject, state_path

# Each name's part, imported when the name is first asked for: `plan status` loads the screen and the history, not
# the watcher's loop, judge and incident book (~30 ms of every `plan` command line otherwise).
_PARTS = {
    "ALERTABLE_EVENTS": ("args", "ALERTABLE_EVENTS"),
    "AckError": ("incidents", "AckError"),
    "Alert": ("incidents", "Alert"),
    "Condition": ("incidents", "Condition"),
    "ControllerDown": ("judge", "ControllerDown"),
    "DEFAULT_EVENTS": ("args", "DEFAULT_EVENTS"),
    "EXIT_CODES": ("incidents", "EXIT_CODES"),
    "HistoryError": ("history", "HistoryError"),
    "INCIDENT_KINDS": ("incidents", "INCIDENT_KINDS"),
    "Incident": ("incidents", "Incident"),
    "Probe": ("judge", "Probe"),
    "Rules": ("state", "Rules"),
    "WAITING_REASONS": ("args", "WAITING_REASONS"),
    "WatchOptions": ("loop", "WatchOptions"),
    "WatchState": ("state", "WatchState"),
    "ack": ("incidents", "ack"),
    "acknowledge": ("state", "acknowledge"),
    "book_of": ("book", "book_of"),
    "check_outcome": ("history", "check_outcome"),
    "duration": ("args", "duration"),
    "evaluate": ("judge", "evaluate"),
    "event_names": ("args", "event_names"),
    "fetch_status": ("judge", "fetch_status"),
    "history_ends": ("history", "select"),
    "history_json": ("history", "to_json"),
    "history_text": ("history", "text"),
    "host_subject": ("state", "host_subject"),
    "incident_lines": ("loop", "incident_lines"),
    "probe": ("judge", "probe"),
    "reconcile": ("incidents", "reconcile"),
    "run_hook": ("loop", "run_hook"),
    "skew_condition": ("book", "skew_condition"),
    "state_path": ("state", "state_path"),
    "status_text": ("screen", "status_text"),
    "take_box_acks": ("book", "take_box_acks"),
    "waiting_limits": ("args", "waiting_limits"),
    "watch_loop": ("loop", "watch_loop"),
}

__all__ = [
    "ALERTABLE_EVENTS",
    "DEFAULT_EVENTS",
    "EXIT_CODES",
    "INCIDENT_KINDS",
    "WAITING_REASONS",
    "AckError",
    "Alert",
    "Condition",
    "HistoryError",
    "ControllerDown",
    "Incident",
    "Probe",
    "Rules",
    "WatchOptions",
    "WatchState",
    "ack",
    "check_outcome",
    "acknowledge",
    "book_of",
    "duration",
    "evaluate",
    "event_names",
    "fetch_status",
    "history_ends",
    "history_json",
    "history_text",
    "host_subject",
    "incident_lines",
    "probe",
    "reconcile",
    "run_hook",
    "skew_condition",
    "state_path",
    "status_text",
    "take_box_acks",
    "waiting_limits",
    "watch_loop",
]


def __getattr__(name: str) -> Any:
    if name not in _PARTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    part, its_name = _PARTS[name]
    value = getattr(importlib.import_module(f"{__name__}.{part}"), its_name)
    globals()[name] = value  # asked for once
    return value
