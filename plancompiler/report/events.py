"""events.jsonl as a report reads it: timestamps as written (local time, with an hour that repeats once a
year), the lines parsed and put in time order."""

from __future__ import annotations

import datetime
import functools
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

from runner.readers import valid_events


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


def local_time(text: str, after: float | None) -> float:
    """TEXT, a naive local time as the runner writes them, as epoch seconds. In the hour a DST fall-back
    repeats, a wall time has two readings: the first one not before AFTER (the previous event) is taken.
    (Per wall hour, cached: a report reads every event's time.)"""
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
    last: float | None = None
    read = _in_zone(zone)
    for event in events:
        epoch = event.get("t")
        try:
            if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch):
                value = float(epoch)
            else:
                value = read(event["ts"], last)
        except (ValueError, OverflowError):
            bad.append(f"{event['ts'][:40]!r}: not a time")
            continue
        last = value if last is None else max(last, value)
        items.append((last, event))
    return items, bad


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
