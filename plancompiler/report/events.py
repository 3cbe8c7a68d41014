"""events.jsonl as a report reads it: timestamps as written (local time, with an hour that repeats once a
year), the lines parsed and put in time order."""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from runner.readers import event_problem, valid_events


def _struct(text: str) -> time.struct_time:
    text = text.strip().replace("T", " ")
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return time.strptime(text, fmt)
        except ValueError:
            continue
    raise ValueError(f"not a time: {text!r} (use 'YYYY-MM-DD HH:MM:SS' or 'YYYY-MM-DD')")


def parse_ts(text: str) -> float:
    """Event or --since/--until time: 'YYYY-MM-DD HH:MM:SS', 'YYYY-MM-DDTHH:MM:SS' or 'YYYY-MM-DD' (local)."""
    try:
        return time.mktime(_struct(text))
    except OverflowError as exc:
        raise ValueError(f"not a time: {text!r} ({exc})") from exc


_WALL = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2}))?$")


@functools.lru_cache(maxsize=4096)
def _hour_readings(year: int, month: int, day: int, hour: int) -> tuple[float, ...]:
    """The epoch readings of that wall hour's start: one, two in the hour a DST fall-back repeats, none in
    the hour a spring-forward skips (or for a date that does not exist)."""
    readings = set()
    for dst in (0, 1):
        value = time.mktime((year, month, day, hour, 0, 0, 0, 0, dst))
        if time.localtime(value)[:4] == (year, month, day, hour):
            readings.add(value)
    return tuple(sorted(readings))


@functools.lru_cache(maxsize=4096)
def _wall_hour(prefix: str) -> tuple[float, ...]:
    """_hour_readings of 'YYYY-MM-DD HH' (a report reads a million times in a few thousand hours)."""
    found = _WALL.match(prefix + ":00")
    if not found:
        return ()
    return _hour_readings(*(int(found.group(i)) for i in range(1, 5)))


def local_time(text: str, after: float | None) -> float:
    """TEXT, a naive local time as the runner writes them, as epoch seconds. In the hour a DST fall-back
    repeats, a wall time has two readings: the first one not before AFTER (the previous event) is taken.
    (Per wall hour, cached: a report reads every event's time.)"""
    if len(text) == 19 and text[13] == ":" and text[16] == ":" and text[10] in " T":  # the runner's own form
        hour_readings = _wall_hour(text[:13])
        minute, second = int(text[14:16]), int(text[17:19])
        if len(hour_readings) == 1 and minute < 60 and second < 62:
            return hour_readings[0] + minute * 60 + second  # no DST change in that hour: one reading
    found = _WALL.match(text.strip())
    if not found:
        return parse_ts(text)
    year, month, day, hour, minute = (int(found.group(i)) for i in range(1, 6))
    second = int(found.group(6) or 0)
    readings = _hour_readings(year, month, day, hour) if minute < 60 and second < 62 else ()
    if not readings:  # a wall time the spring-forward skipped, or no time at all (ValueError)
        return parse_ts(text)
    offset = minute * 60 + second
    later = [v + offset for v in readings if after is None or v + offset >= after]
    return min(later) if later else readings[-1] + offset


def _in_zone(zone: dict[str, Any] | None) -> Callable[[str, float | None], float]:
    """How a zone-less `ts` is read: in the box's zone where the agent said it (by name, else by its offset), else
    in this machine's own (an events file read here)."""
    if not isinstance(zone, dict):
        return local_time
    tz: datetime.tzinfo | None = None
    name = zone.get("name")
    if isinstance(name, str) and name:
        try:
            import zoneinfo

            tz = zoneinfo.ZoneInfo(name)
        except (ImportError, ValueError, OSError):
            tz = None
    offset = zone.get("offset_s")
    if tz is None and isinstance(offset, int) and not isinstance(offset, bool) and abs(offset) < 86400:
        tz = datetime.timezone(datetime.timedelta(seconds=offset))
    if tz is None:
        return local_time
    zone_info = tz

    def read(text: str, after: float | None) -> float:
        return datetime.datetime(*_struct(text)[:6], tzinfo=zone_info).timestamp()

    return read


def timed(
    events: list[dict[str, Any]], zone: dict[str, Any] | None = None
) -> tuple[list[tuple[float, dict[str, Any]]], list[str]]:
    """Each event with its time, in file order (the order the runner appended them): its epoch `t` where the
    runner wrote one, else its `ts` read in the box's ZONE (the seed's events), DST-ambiguous wall times read so
    the order holds; a clock set back is held at the previous time, so no span is negative. An event whose time
    is no real time is left out, and said."""
    items: list[tuple[float, dict[str, Any]]] = []
    bad: list[str] = []
    clock = Clock(zone)
    for event in events:
        value = clock.time(event)
        if value is None:
            bad.append(f"{event['ts'][:40]!r}: not a time")
            continue
        items.append((value, event))
    return items, bad


class Clock:
    """Events' times one at a time, as `timed` reads them (a report streams a million events through one)."""

    def __init__(self, zone: dict[str, Any] | None = None) -> None:
        self.read = _in_zone(zone)
        self.last: float | None = None

    def time(self, event: dict[str, Any]) -> float | None:
        """EVENT's time, never before the previous one's; None when it is no real time."""
        epoch = event.get("t")
        try:
            if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch):
                value = float(epoch)
            else:
                value = self.read(event["ts"], self.last)
        except (ValueError, OverflowError):
            return None
        self.last = value if self.last is None else max(self.last, value)
        return self.last


def parse_events(text: str, source: str, empty_ok: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """The usable events in an events.jsonl TEXT, and a line for each malformed line (by line number).
    ValueError when there are none: SOURCE is then no events file (or has no events yet)."""
    events: list[dict[str, Any]] = []
    skipped: list[str] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            skipped.append(f"line {number}: not JSON")
            continue
        good, bad = valid_events([value], f"line {number}")
        events += good
        skipped += [b.replace(f"line {number} 1:", f"line {number}:") for b in bad]
    if not events:
        if not any(line.strip() for line in lines) and empty_ok:
            return events, skipped  # a host's queue with nothing in it yet
        if not any(line.strip() for line in lines):
            raise ValueError(f"{source}: no events (it is empty)")
        raise ValueError(
            f"{source}: not an events.jsonl: none of its {len(lines)} lines is an event record ({skipped[0]})"
        )
    return events, skipped


def format_ts(ts: float, zone: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" + (" %Z" if zone else ""), time.localtime(ts))


def read_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


# Event kinds the analysis reads (spans, jobs, clusters); the rest count only for silences, by their time.
KEPT_KINDS = frozenset(
    {
        "lane",
        "runner-start",
        "runner-stop",
        "start",
        "done",
        "failed",
        "retry",
        "timeout",
        "cancelled",
        "start-failed",
        "recovered",  # an attempt put back in the queue: the job's outcome until it starts again
        "skipped",
        "invalid",
        "blocked",
        "gpu-wait",
        "correlated-failure",
    }
)
# Before --since only what carries the lanes' state (and a seed log's busy spans) into the window matters.
_BEFORE_KINDS = frozenset({"lane", "runner-start", "start", "done", "failed", "retry", "timeout", "cancelled"})
_BEFORE_KINDS |= {"start-failed", "gpu-wait", "heartbeat"}
_KIND = re.compile(r'"event": "([a-z-]+)"')
_EPOCH = re.compile(r'"t": ([0-9]+(?:\.[0-9]+)?)\}\s*$')
_PREFIX = '{"ts": "'
MAX_NOTES = 1000


class EventLines:
    """The events of an events.jsonl read line by line (a file of a million lines is never held whole), and
    what was wrong with the others. A line as the runner writes it (`ts`, `job`, `event` first) of a kind the
    report does not read is taken by its time alone, unparsed. With SINCE: such a line more than two hours (a DST
    change) before it, of a kind that cannot carry state into the window, is skipped without a record."""

    def __init__(self, lines: Iterable[str], since: float | None = None) -> None:
        self.lines = lines
        self.cut = format_ts(since - 7200) if since is not None else None
        self.count = 0  # lines read that are not blank
        self.events = 0  # usable events
        self.notes: list[str] = []
        self.more = 0  # notes past MAX_NOTES, counted

    def _note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self.more += 1

    def skipped(self) -> list[str]:
        return self.notes + ([f"... and {self.more} more lines left out"] if self.more else [])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        cut = self.cut
        for number, line in enumerate(self.lines, 1):
            if line.startswith(_PREFIX) and line[27:29] == '",':  # as the runner writes them: ts, job, event, ...
                found = _KIND.search(line, 29)
                kind = found.group(1) if found is not None else None
                if kind is not None and cut is not None and line[8:27] < cut and kind not in _BEFORE_KINDS:
                    self.count += 1
                    self.events += 1
                    continue  # long before the window, and no state in it: no record built
                if kind is not None and kind not in KEPT_KINDS:
                    self.count += 1
                    self.events += 1
                    # Only its time counts (a silence ends at it): read without parsing the line.
                    epoch = _EPOCH.search(line)
                    yield {"ts": line[8:27], "event": kind, **({"t": float(epoch.group(1))} if epoch else {})}
                    continue
            if not line.strip():
                continue
            self.count += 1
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                self._note(f"line {number}: not JSON")
                continue
            problem = event_problem(value)
            if problem is not None:
                self._note(f"line {number}: {problem}")
                continue
            self.events += 1
            yield value

    def check(self, source: str, empty_ok: bool = False) -> None:
        """ValueError when nothing read was an event: SOURCE is then no events file (or has none yet)."""
        if self.events:
            return
        if not self.count:
            if empty_ok:
                return  # a host's queue with nothing in it yet
            raise ValueError(f"{source}: no events (it is empty)")
        raise ValueError(
            f"{source}: not an events.jsonl: none of its {self.count} lines is an event record ({self.notes[0]})"
        )
