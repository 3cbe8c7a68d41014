"""Every file the runner reads back (state.json, manifest.json, parked.json, control requests), checked field by field.

A field of the wrong type falls back to its default and is reported as a problem `(field, why)`, which the
runner turns into one `state-corrupt` event: well-formed JSON of the wrong shape must never crash a tick
(under systemd that is a restart loop that runs nothing).
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Tuple

    Problem = Tuple[str, str]  # (field, what was wrong and what was used instead)

STATE_MAPS = ("attempts", "waiting_since", "backoff_until", "last_failure", "held", "priority")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_state(raw: Any) -> tuple[dict[str, Any], list[Problem]]:
    """state.json as the runner uses it; the seed's flat {job: attempts} form is read as attempts."""
    state: dict[str, Any] = {key: {} for key in STATE_MAPS}
    problems: list[Problem] = []
    if raw is None:
        return state, problems
    if not isinstance(raw, dict):
        return state, [("(whole file)", f"expected an object, got {_kind(raw)}: started from empty state")]
    if "version" in raw and not (isinstance(raw["version"], int) and not isinstance(raw["version"], bool)):
        problems.append(("version", f"expected a whole number, got {_kind(raw['version'])}: read as version 1"))
    if not any(key in raw for key in STATE_MAPS) and "version" not in raw:  # the seed's form
        raw = {"attempts": raw}
    for key in STATE_MAPS:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            problems.append((key, f"expected an object, got {_kind(value)}: used {{}}"))
            continue
        for job, item in value.items():
            if _STATE_ITEM_OK[key](item):
                state[key][job] = item
            else:
                want = {
                    "attempts": "a whole number >= 0",
                    "last_failure": "an object",
                    "held": "an object",
                    "priority": "a whole number",
                }.get(key, "a number")
                problems.append((f"{key}.{job}", f"expected {want}, got {_kind(item)} {item!r:.40}: dropped"))
    return state, problems


_STATE_ITEM_OK = {
    "attempts": lambda item: isinstance(item, int) and not isinstance(item, bool) and item >= 0,
    "waiting_since": _number,
    "backoff_until": _number,
    "last_failure": lambda item: isinstance(item, dict),
    "held": lambda item: isinstance(item, dict),
    "priority": lambda item: isinstance(item, int) and not isinstance(item, bool),
}


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# The fields of a manifest job entry the runner keeps in slots; any other is kept as it is but these, which the
# runner reads from the job file's header instead.
_FIELDS = ("requires", "after", "family", "sha", "rerun")
_DROPPED = ("outputs", "lane")
_MISSING = object()


def compact_names(value: Any) -> Any:
    """A list of names as a tuple of interned strings (10 000 jobs share their lanes, families and paths)."""
    if isinstance(value, list):
        return tuple(sys.intern(v) if isinstance(v, str) else v for v in value)
    return sys.intern(value) if isinstance(value, str) and len(value) < 200 else value


def _sha(value: Any) -> Any:
    """A sha256 as its 32 bytes (its 64 hex digits were a string of 113 bytes for every queued job); anything
    else as it is. Read back as the hex it was (JobEntry.__getitem__)."""
    if isinstance(value, str) and len(value) == 64:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return value
        return raw if raw.hex() == value else value
    return value


class JobEntry(Mapping):
    """One job's entry in manifest.json as the runner keeps it: read like the dict it was (`entry.get("after")`),
    held in slots, its lists as tuples (a dict and its lists per queued job were most of a runner's memory)."""

    __slots__ = (*_FIELDS, "rest")

    def __init__(self, raw: Mapping[str, Any]) -> None:
        for key in _FIELDS:
            setattr(self, key, compact_names(raw[key]) if key in raw and key != "sha" else _MISSING)
        self.sha = _sha(raw["sha"]) if "sha" in raw else _MISSING
        rest = {k: v for k, v in raw.items() if k not in _FIELDS and k not in _DROPPED}
        self.rest = rest or None

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, _MISSING) if key in _FIELDS else (self.rest or {}).get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value.hex() if isinstance(value, bytes) else value  # only a sha is kept as bytes

    def __iter__(self) -> Iterator[str]:
        yield from (key for key in _FIELDS if getattr(self, key) is not _MISSING)
        yield from self.rest or ()

    def __len__(self) -> int:
        return sum(1 for _ in self)


def manifest_object(value: dict[str, Any]) -> Any:
    """json's object_hook for manifest.json as the runner reads it: a job's entry becomes a JobEntry as it is
    parsed (where its fields have their types: else check_manifest reports it), and a plan's own copy of its
    jobs and producers is dropped at once, so 10 000 jobs' entries never stand as dicts all at once."""
    if "sha" in value and ("after" in value or "requires" in value):
        lists = all(
            isinstance(value.get(key, []), list) and all(isinstance(v, str) for v in value.get(key, []))
            for key in ("requires", "after", "outputs")
        )
        return JobEntry(value) if lists and isinstance(value["sha"], str) else value
    if "jobs" in value and "pushed_at" in value:  # plans.<plan>: push reads its jobs from the file, never the runner
        return {k: v for k, v in value.items() if k not in ("jobs", "producers")}
    return value


def check_manifest(raw: Any) -> tuple[dict[str, Any] | None, list[Problem]]:
    """manifest.json's job graph: `jobs` {file: {requires, outputs, sha}}, `producers` {path: [file]},
    `external` [path]. Whatever has the wrong type is left out."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [("(whole file)", f"expected an object, got {_kind(raw)}: ignored")]
    problems: list[Problem] = []
    manifest: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("jobs", "producers", "external")}
    jobs: dict[str, Any] = {}
    value = raw.get("jobs", {})
    if not isinstance(value, dict):
        problems.append(("jobs", f"expected an object, got {_kind(value)}: used {{}}"))
        value = {}
    # Where every entry was checked as it was parsed (the runner's read), the table read is the one kept: a copy
    # of 100,000 jobs' table stood beside it for nothing.
    checked = all(isinstance(entry, JobEntry) for entry in value.values())
    for name, entry in () if checked else value.items():
        if isinstance(entry, JobEntry):  # checked as it was parsed (manifest_object)
            jobs[name] = entry
            continue
        if not isinstance(entry, dict):
            problems.append((f"jobs.{name}", f"expected an object, got {_kind(entry)}: dropped"))
            continue
        clean = dict(entry)
        for key in ("requires", "outputs", "after"):
            if key in clean and not _strings(clean[key]):
                problems.append((f"jobs.{name}.{key}", f"expected a list of strings, got {_kind(clean[key])}: used []"))
                clean[key] = []
        if "sha" in clean and not isinstance(clean["sha"], str):
            problems.append((f"jobs.{name}.sha", f"expected a string, got {_kind(clean['sha'])}: ignored"))
            clean.pop("sha")
        jobs[name] = clean
    if checked:
        jobs = value
    producers: dict[str, list[str]] = {}
    value = raw.get("producers", {})
    if not isinstance(value, dict):
        problems.append(("producers", f"expected an object, got {_kind(value)}: used {{}}"))
        value = {}
    valid = all(_strings(names) for names in value.values())  # then kept as read (no copy), as the jobs are
    for path, names in () if valid else value.items():
        if _strings(names):
            producers[path] = names
        else:
            problems.append((f"producers.{path}", f"expected a list of strings, got {_kind(names)}: dropped"))
    if valid:
        producers = value
    external = raw.get("external", [])
    if not _strings(external):
        problems.append(("external", f"expected a list of strings, got {_kind(external)}: used []"))
        external = []
    manifest.update(jobs=jobs, producers=producers, external=external)
    return manifest, problems


def check_park(raw: Any) -> tuple[str, list[Problem]]:
    """Why the queue is parked, from parked.json (the file existing is what parks it)."""
    if not isinstance(raw, dict):
        return "parked", [("(whole file)", f"expected an object, got {_kind(raw)}: parked without a reason")]
    problems = [
        (key, f"expected a string, got {_kind(raw[key])}")
        for key in ("since", "reason", "by")
        if key in raw and not isinstance(raw[key], str)
    ]
    since = raw.get("since") if isinstance(raw.get("since"), str) else "?"
    reason = raw.get("reason") if isinstance(raw.get("reason"), str) else ""
    said = f": {reason}" if isinstance(reason, str) and reason.strip() else ""  # never a colon before nothing
    return f"parked since {since}{said}", problems


def check_request(raw: Any) -> tuple[dict[str, str] | None, list[Problem]]:
    """A control request's body: an object whose `by` is a string (an empty file is an empty request)."""
    if raw is None:
        return {"by": "?"}, []
    if not isinstance(raw, dict):
        return None, [("(whole file)", f"expected an object, got {_kind(raw)}: request not carried out")]
    by = raw.get("by", "?")
    if not isinstance(by, str):
        return None, [("by", f"expected a string, got {_kind(by)}: request not carried out")]
    return {"by": by}, []


_PIECE = 1 << 20  # bytes of a large JSON file read at a time
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = frozenset("0123456789.eE+-")
_DEEP = 4  # containers nearer the top than this are read member by member when large (manifest.json's jobs,
# producers and plans.P.jobs); deeper ones, and small ones, by the json module whole


class JsonPieces:
    """A JSON file read a piece at a time: the text of a 100 000-job manifest.json (60 MB, and as much again
    decoded) is never in memory at once, only _PIECE of it and the values built. Members whose path SKIP names
    are read (and checked) but not kept. What json.loads(text, object_hook=HOOK) returns, built bottom-up alike."""

    def __init__(
        self,
        handle: BinaryIO,
        hook: Callable[[dict[str, Any]], Any] | None = None,
        skip: Callable[[tuple[Any, ...]], bool] | None = None,
    ) -> None:
        self.handle = handle
        self.text = codecs.getincrementaldecoder("utf-8-sig")()  # as json.loads(bytes) reads UTF-8
        self.decoder = json.JSONDecoder(object_hook=hook)
        self.hook = hook
        self.skip = skip or (lambda path: False)
        self.buf = ""
        self.pos = 0
        self.base = 0  # characters read before buf
        self.eof = False

    def read(self) -> Any:
        try:
            value = self._value(())
        except RecursionError:
            raise ValueError("nested too deep") from None
        if self._peek():
            raise self._error("Extra data")
        return value

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self.handle.read(_PIECE)
        self.eof = not data
        self.base += self.pos
        self.buf = self.buf[self.pos :] + self.text.decode(data, final=self.eof)
        self.pos = 0
        return True

    def _peek(self) -> str:
        """The next character that is not white space; "" at the end."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]  # matches always
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def _error(self, why: str, pos: int | None = None) -> ValueError:
        return ValueError(f"{why}: char {self.base + (self.pos if pos is None else pos)}")

    def _value(self, path: tuple[Any, ...], keep: bool = True) -> Any:
        first = self._peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
                # a number that reaches the piece's end ("2" of "2.5") may go on in the next
                if self.eof or (end < len(self.buf) and self.buf[end] not in _NUMBER):
                    self.pos = end
                    return value
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise self._error(exc.msg, exc.pos) from None
            if first in "{[" and len(path) < _DEEP and len(self.buf) - self.pos >= _PIECE:
                return self._container(first, path, keep)  # larger than a piece: member by member
            self._more()

    def _container(self, first: str, path: tuple[Any, ...], keep: bool) -> Any:
        self.pos += 1
        items: list[Any] = []
        members: dict[str, Any] = {}
        close = "]" if first == "[" else "}"
        if self._peek() == close:
            self.pos += 1
        else:
            while True:
                if first == "[":
                    item = self._value((*path, len(items)), keep)
                    if keep:
                        items.append(item)
                else:
                    if self._peek() != '"':
                        raise self._error("Expecting property name enclosed in double quotes")
                    key = self._value(path)
                    if self._peek() != ":":
                        raise self._error("Expecting ':' delimiter")
                    self.pos += 1
                    wanted = keep and not self.skip((*path, key))
                    item = self._value((*path, key), wanted)
                    if wanted:
                        members[key] = item
                after = self._peek()
                self.pos += 1
                if after == close:
                    break
                if after != ",":
                    raise self._error("Expecting ',' delimiter", self.pos - 1)
        if first == "[":
            return items
        return self.hook(members) if self.hook is not None and keep else members
