"""`plan status` and `plan watch`: one bounded probe of a host's queue, judged as events and standing states.

state (rules and the state file), judge (a probe and its conditions), book (the box's incident book read as
conditions, SKEW, the DIGEST), incidents (one incident per cause, acks), screen (`plan status`'s text), loop
(`plan watch`'s loop and hooks), args (its options). This is the door: the rest of plancompiler imports the
names below, from `plancompiler.watch`."""

from __future__ import annotations

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
