"""`plan watch`'s words checked against the vocabularies: event names, waiting reasons, durations."""

from __future__ import annotations

from plancompiler.watch.incidents import did_you_mean
from runner.durations import parse_duration
from runner.vocab import EVENT_NAMES, ORDINARY_REASONS, REASON_NAMES, Event, Reason

DEFAULT_EVENTS: tuple[str, ...] = tuple(
    e.value
    for e in (
        Event.FAILED,
        Event.RETRY,
        Event.GPU_WAIT,
        Event.REQUIRES_WAIT,
        Event.BLOCKED,
        Event.INVALID,
        Event.TIMEOUT,
        Event.STALLED,
        Event.GPU_STALLED,
        Event.LONG_RUNNING,
        Event.ORPHANS_KILLED,
        Event.CORRELATED_FAILURE,
        Event.IDLE,
    )
)
ALERTABLE_EVENTS = tuple(sorted(EVENT_NAMES))
# A job waiting for one of these is judged WAITING; blocked and parked have kinds of their own.
WAITING_REASONS = tuple(sorted(REASON_NAMES - ORDINARY_REASONS - {Reason.BLOCKED.value, Reason.PARKED.value}))

NO_EVENTS = "none"  # `--events none`: no event alerts at all, only standing states


def _words(values: list[str] | None) -> list[str]:
    return [w.strip() for value in values or [] for w in value.split(",") if w.strip()]


def event_names(events: str | None, wake_on: list[str] | None) -> tuple[str, ...]:
    """--events (replaces the default list) plus --wake-on; ValueError naming the unknown word."""
    chosen = DEFAULT_EVENTS if events is None else tuple(_words([events]))
    for flag, words in (("--events", chosen), ("--wake-on", tuple(_words(wake_on)))):
        for word in words:
            if word not in ALERTABLE_EVENTS and not (flag == "--events" and word == NO_EVENTS):
                raise ValueError(
                    f"{flag}: unknown event {word!r}{did_you_mean(word, ALERTABLE_EVENTS)} "
                    f"(events: {', '.join(ALERTABLE_EVENTS)})"
                )
    names = [w for w in chosen if w != NO_EVENTS] + _words(wake_on)
    return tuple(dict.fromkeys(names))


def waiting_limits(values: list[str] | None, default: float) -> tuple[float, dict[str, float]]:
    """--waiting DURATION and --waiting REASON=DURATION (repeatable, or comma-separated)."""
    by_reason: dict[str, float] = {}
    for word in _words(values):
        reason, sep, text = word.rpartition("=")
        if sep and reason not in WAITING_REASONS:
            raise ValueError(
                f"--waiting: {reason!r} is not a reason a job waits on for long"
                f"{did_you_mean(reason, WAITING_REASONS)} (reasons: {', '.join(WAITING_REASONS)})"
            )
        seconds = duration("--waiting", text)
        if sep:
            by_reason[reason] = seconds
        else:
            default = seconds
    return default, by_reason


def duration(flag: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from exc
