"""Validated readers of events.jsonl lines and status.json, the one terminal-safe text filter, and the two
readers every host answer uses: a log's `tail` and the window of events a status asks for (`read_events`);
whether the runner status.json names is alive (`runner_alive`), and whether it stopped cleanly (`runner_stopped`).

The runner writes these files, but a person, a crash or a disk can leave anything in them; whoever
reads them (the host agent, `plan status`, `plan watch`, `plan report`) checks the field types here,
skips what is malformed and says so, instead of failing later on a KeyError or a TypeError.
"""

from __future__ import annotations

import functools
import os
import re

from runner.digest import sha256_hex
from runner.files import loads, open_regular
from runner.vocab import Event

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_STR: tuple[type, ...] = (str,)
_NUM: tuple[type, ...] = (int, float)
# The fields readers use, and the types they must have where present.
_EVENT_FIELDS: dict[str, tuple[type, ...]] = {
    "ts": _STR,
    "event": _STR,
    "job": _STR,
    "lane": _STR,
    "state": _STR,
    "reason": _STR,
    "blocker": _STR,
    "detail": _STR,
    "why": _STR,
    "note": _STR,
    "was": _STR,
    "by": _STR,
    "line": _STR,
    "ended": _STR,
    "last_alive": _STR,
    "duration_s": _NUM,
    "t": _NUM,
    "while_down": (bool,),
    "tail": (list,),
    "jobs": (list,),
}
_STR_LISTS = ("tail", "jobs")


def box_zone() -> dict[str, Any]:
    """This box's time zone as the agent reports it: its UTC offset now, and its name where one is known (a
    reader reads the seed's zone-less `ts` in it)."""
    import os
    import time

    offset = -(time.altzone if time.localtime().tm_isdst > 0 else time.timezone)
    name = os.environ.get("TZ", "").lstrip(":")
    if not name:
        try:
            with open("/etc/timezone") as handle:
                name = handle.read().strip()
        except OSError:
            try:
                name = os.readlink("/etc/localtime").partition("zoneinfo/")[2]
            except OSError:
                name = ""
    return {"offset_s": offset, "name": name or None}


# Fields a reader uses as they are; any other may be null (the runner writes `last_alive: null`).
_NOT_NULL = frozenset({"ts", "event", "job", "lane", "state", "tail", "jobs"})
# Events about one job: without a job name they say nothing.
_JOB_EVENTS = frozenset(
    e.value
    for e in (
        Event.START,
        Event.DONE,
        Event.FAILED,
        Event.RETRY,
        Event.SKIPPED,
        Event.INVALID,
        Event.BLOCKED,
        Event.TIMEOUT,
        Event.CANCELLED,
        Event.START_FAILED,
    )
)
# A `lane` event's states: anything else there is a malformed event (and never a class name in the HTML report).
LANE_STATES = frozenset({"busy", "idle", "waiting", "down", "stopped"})
_TS = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?$")


def _kind(value: Any) -> str:
    """VALUE's JSON type with its article: 'a list', 'an int', 'null'."""
    if value is None:
        return "null"
    name = {"str": "string", "dict": "object", "list": "list", "bool": "boolean"}.get(
        type(value).__name__, type(value).__name__
    )
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def event_problem(event: Any) -> str | None:
    """Why EVENT (one parsed events.jsonl line) cannot be used, or None when it can."""
    if not isinstance(event, dict):
        return f"not a JSON object but {_kind(event)}"
    for name in ("event", "ts"):
        if name not in event:
            return f"no {name!r} field"
    # The event's own fields, not every known one: a report reads a million of these.
    for name, value in event.items():
        types = _EVENT_FIELDS.get(name)
        if types is None or (value is None and name not in _NOT_NULL):
            continue
        if not isinstance(value, types) or (types is _NUM and isinstance(value, bool)):
            return f"{name!r} is {_kind(value)}"
        if name in _STR_LISTS and not all(isinstance(v, str) for v in event[name]):
            return f"{name!r} holds something that is not a string"
    if not _TS.match(event["ts"].strip()):
        return f"'ts' {event['ts'][:40]!r} is not a time"
    if event["event"] == Event.LANE.value and event.get("state", "idle") not in LANE_STATES:
        return f"lane state {event['state'][:40]!r} is not one of {', '.join(sorted(LANE_STATES))}"
    if event["event"] in _JOB_EVENTS and "job" not in event:
        return f"a {event['event']!r} event with no 'job'"
    return None


def valid_events(events: list[Any], where: str = "") -> tuple[list[dict[str, Any]], list[str]]:
    """The usable EVENTS, and one line per skipped one (WHERE says which line of which file, if known)."""
    good: list[dict[str, Any]] = []
    skipped: list[str] = []
    for index, event in enumerate(events):
        problem = event_problem(event)
        if problem is None:
            good.append(event)
        else:
            skipped.append(f"{where or 'event'} {index + 1}: {problem}")
    return good, skipped


def _check(value: Any, types: tuple[type, ...], at: str, nullable: bool = True) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, types) or (types is _NUM and isinstance(value, bool)):
        return f"{at} is {_kind(value)}"
    return None


def _items(value: Any, at: str, fields: dict[str, tuple[type, ...]], required: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list):
        return f"{at} is {_kind(value)}, not a list"
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            return f"{at}[{i}] is {_kind(item)}, not an object"
        for name in required:
            if not isinstance(item.get(name), str):
                return f"{at}[{i}].{name} is {_kind(item.get(name))}, not a string"
        for name, types in fields.items():
            problem = _check(item.get(name), types, f"{at}[{i}].{name}")
            if problem:
                return problem
    return None


_RUNNING: dict[str, tuple[type, ...]] = {
    "elapsed_s": _NUM,
    "warn_after_s": _NUM,
    "log_grew_at": _NUM,
    "last_line": _STR,
    "progress": _STR,
}
_QUEUED: dict[str, tuple[type, ...]] = {"since": _NUM, "detail": _STR, "blocker": _STR}


def status_problem(status: Any) -> str | None:
    """Why STATUS (status.json's content) cannot be read, or None when it can."""
    if not isinstance(status, dict):
        return f"it is {_kind(status)}, not an object"
    runner = status.get("runner")
    if runner is not None:
        if not isinstance(runner, dict):
            return f"'runner' is {_kind(runner)}, not an object"
        for name, types in (("heartbeat", _NUM), ("pid", (int,))):
            problem = _check(runner.get(name), types, f"runner.{name}")
            if problem:
                return problem
    problem = (
        _items(status.get("running"), "running", _RUNNING, ("job", "lane"))
        or _items(status.get("queued"), "queued", _QUEUED, ("job", "reason"))
        or _items(status.get("queued_first"), "queued_first", _QUEUED, ("job", "reason"))
    )
    if problem:
        return problem
    lanes = status.get("lanes")
    if lanes is not None:
        if not isinstance(lanes, dict):
            return f"'lanes' is {_kind(lanes)}, not an object"
        for name, view in lanes.items():
            if not isinstance(view, dict):
                return f"lanes.{name} is {_kind(view)}, not an object"
            problem = _check(view.get("since"), _NUM, f"lanes.{name}.since") or _check(
                view.get("state"), _STR, f"lanes.{name}.state"
            )
            if problem:
                return problem
    order = status.get("lane_order")
    if order is not None and not (isinstance(order, list) and all(isinstance(x, str) for x in order)):
        return "'lane_order' is not a list of names"
    for name in ("counts", "write_errors", "gpu_unknown", "gpus"):
        problem = _check(status.get(name), (dict,), f"'{name}'")
        if problem:
            return problem
    return _items(status.get("leaks"), "leaks", {}, ())


@functools.lru_cache(maxsize=None)
def _unsafe() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(sequences, controls), compiled at the first text made safe (~4.5 M instructions: an agent's status
    answer makes none): every escape sequence a terminal acts on (CSI, OSC/DCS/SOS/PM/APC strings to their
    terminator or the end, two-byte ESC sequences, then the 8-bit C1 forms of the same); C0 and C1 controls, and
    the bidirectional overrides and isolates that make a terminal show text in another order than it is."""
    sequences = (
        r"\x1b\[[0-?]*[ -/]*[@-~]?"
        r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
        r"|\x1b[ -/]*[0-~]?"
        r"|\x9b[0-?]*[ -/]*[@-~]?"
        r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    )
    return re.compile(sequences), re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str, newlines: bool = True) -> str:
    """TEXT with every terminal control sequence removed and each other control character shown as '?':
    what a job printed, or a queue file holds, can then not retitle, recolour or rewrite a terminal, write the
    clipboard (OSC 52) or reorder what is shown (bidi overrides). The one sanitiser of every string a host sent
    before it reaches a terminal: status, watch, logs, report, and the CLI's messages and host output.
    Tabs become spaces; a carriage return (a progress bar's redraw) a newline; newlines stay unless NEWLINES
    is false."""
    sequences, controls = _unsafe()
    text = sequences.sub("", text).replace("\t", " ").replace("\r\n", "\n").replace("\r", "\n")
    if not newlines:
        text = text.replace("\n", " ")
    return controls.sub("?", text)


def tail(path: str, limit: int) -> tuple[str, int]:
    """The last LIMIT bytes of PATH as text, and its size."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace"), size
    except OSError:
        return "", 0


def read_events(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """A window of events.jsonl: from `offset` (a watcher's place; a rotated file is read from 0), or its tail."""
    events_path = os.path.join(root, "events.jsonl")
    offset = int(request.get("offset", -1))
    try:
        size = os.path.getsize(events_path)
    except OSError:
        size = 0
    events: list[Any] = []
    new_offset, rotated = size, False
    if offset >= 0:
        # A file truncated or replaced since the last probe starts with other bytes: read it all.
        if offset > size or (request.get("head") and offset > 0 and request["head"] != _head(events_path, offset)):
            offset, rotated = 0, True
        data = b""
        if size:
            try:
                with open_regular(events_path) as handle:
                    handle.seek(offset)
                    data = handle.read(int(request.get("max_bytes", 1 << 20)))
            except OSError:  # no regular file: nothing to read, never a probe that blocks
                pass
        cut = data.rfind(b"\n") + 1
        new_offset = offset + cut
        lines = data[:cut].split(b"\n")[:-1]
        at = offset
    else:
        limit = int(request.get("tail_bytes", 16384))
        text, _ = tail(events_path, limit)
        lines = [ln.encode() for ln in (text.splitlines()[1:] if len(text) >= limit else text.splitlines())]
        at = max(0, size - sum(len(ln) + 1 for ln in lines))
    skipped: list[str] = []
    for line in lines:
        # A malformed line is skipped and named by its byte offset, so the watcher's offset still advances.
        try:
            event: Any = loads(line)
            problem = event_problem(event)
        except ValueError:
            problem = "not JSON"
        if problem is None:
            events.append(event)
        elif line.strip():
            skipped.append(f"events.jsonl line {_line_at(events_path, at)}: {problem}")
        at += len(line) + 1
    head = _head(events_path, new_offset) if new_offset else ""
    return {"events": events, "offset": new_offset, "rotated": rotated, "head": head, "skipped": skipped}


def _line_at(path: str, offset: int) -> int:
    """The line number of the line that starts at byte OFFSET: counted only for a malformed line, which is
    said once, so a healthy probe never reads the whole file."""
    count = 1
    try:
        with open_regular(path) as handle:
            while offset > 0:
                chunk = handle.read(min(offset, 1 << 20))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                offset -= len(chunk)
    except OSError:
        pass
    return count


def _head(path: str, offset: int) -> str:
    """The fingerprint of the file's first bytes up to OFFSET (at most 256): a file still shorter than 256
    bytes keeps the one a watcher stored as it grows; a rotated one has another."""
    try:
        with open_regular(path) as handle:
            return sha256_hex(handle.read(min(256, offset)))[:16]
    except OSError:
        return ""


def runner_alive(status: Any) -> bool:
    """Whether the pid in status.json is a live runner process on this host."""
    runner = status.get("runner") if isinstance(status, dict) else None
    pid = runner.get("pid") if isinstance(runner, dict) else None
    if not isinstance(pid, int):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"runner" in handle.read()
    except OSError:
        return False


def last_lifecycle(root: str) -> dict[str, Any] | None:
    """The last runner-start or runner-stop in the tail of ROOT's events.jsonl (its last 64 KiB)."""
    try:
        with open_regular(os.path.join(root, "events.jsonl")) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - 65536))
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b"runner-st" not in line:
            continue
        try:
            event = loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in (Event.RUNNER_START.value, Event.RUNNER_STOP.value):
            return event
    return None


def runner_stopped(root: str, status: Any) -> dict[str, Any] | None:
    """How the runner status.json names stopped, where it stopped cleanly: its runner-stop event is the last word
    of a runner in events.jsonl, and came after that runner started. {"at": epoch, "ts": box time, "why": what
    stopped it (SIGTERM, SIGINT)}; None for a runner that runs, or that ended without one (killed, crashed: dead)."""
    runner = status.get("runner") if isinstance(status, dict) else None
    if not isinstance(runner, dict):
        return None
    event = last_lifecycle(root)
    if not isinstance(event, dict) or event.get("event") != Event.RUNNER_STOP.value:
        return None
    at, started = event.get("t"), runner.get("started")
    if isinstance(at, (int, float)) and isinstance(started, (int, float)) and at < started:
        return None  # an earlier runner's stop: this one started after it and ended without a word
    why = event.get("why")
    return {
        "at": float(at) if isinstance(at, (int, float)) else None,
        "ts": str(event.get("ts") or "?"),
        "why": why if isinstance(why, str) and why else "?",
    }


def stopped_words(stopped: Any) -> str | None:
    """`stopped at 2026-12-04 09:24:45 (SIGTERM)` for runner_stopped's record; None for anything else."""
    if not isinstance(stopped, dict):
        return None
    return (
        f"stopped at {terminal_safe(str(stopped.get('ts') or '?'))} ({terminal_safe(str(stopped.get('why') or '?'))})"
    )
