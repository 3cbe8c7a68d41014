"""Contract 1: parse and format job files; the compiler writes with `format`, the runner reads with `parse`."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from runner.durations import parse_duration, parse_limit

if TYPE_CHECKING:
    from typing import Optional, Tuple

    from runner.conditions import Condition

    _Waits = Tuple[Tuple[str, float], ...]
    _Shape = Tuple[str, int, Optional[float], Optional[float], Tuple[str, ...], int, _Waits, int]

SEED_KEYS = ("LANE", "REQUIRES", "DONE_IF", "RETRIES")
HEADER_KEYS = (*SEED_KEYS, "TIMEOUT", "WARN_AFTER", "OUTPUTS", "PLAN", "GPUS", "EXPECT_WAIT", "PRIORITY")
MAX_GPUS = 64
DEFAULT_LANES = ("net", "gpu", "cpu")
DEFAULT_LANE = "cpu"
# \Z, not $: `$` also matches before a final newline, and a name ending in "\n" must never pass.
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_KEY_LINE = re.compile(r"^#\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# A comment that looks like it meant to be a header key (`# LANE: gpu`, `#REQUIRE =x`).
# One tuple per set of header keys in use, not one per queued job.
_KEY_SETS: dict[tuple[str, ...], tuple[str, ...]] = {}
_KEYISH_LINE = re.compile(r"^#\s*([A-Z][A-Z0-9_]*)\s*[:=]")
BOM = "\ufeff"


# What most queued jobs share (lane, retries, limits, header keys, GPUs, waits, priority): one tuple for them
# all, as long as there are few (a plan's foreach makes thousands of jobs of one shape).
_SHAPES: dict[_Shape, _Shape] = {}
_FIELDS: tuple[str, ...] = ("name", "lane", "body", "requires", "done_if", "retries", "timeout_s", "warn_after_s")
_FIELDS += ("outputs", "plan", "keys", "gpus", "expect_wait", "priority")


class JobFile:
    """A job file that parsed completely: the only kind the runner executes. Immutable, compared by its fields,
    and small: a queued runner keeps one per job (100 000 of them), so it is in slots, keeps its file name (the
    one string the runner's tables share) rather than its job name, and what most jobs have in common in one
    shared shape. EXPECT_WAIT: how long a wait is normal, per reason ("*": any); nothing alerts before it has
    passed. PRIORITY: within a lane the higher starts first; equal ones in name order. GPUS: the GPUs it takes in
    the gpu lane, where the runner gives each job its own (--gpus)."""

    __slots__ = ("filename", "body", "_requires", "_done_if", "outputs", "plan", "_shape")
    filename: str
    body: str
    _requires: str | Condition | None  # a queued job's: its compiled condition (whose text it is)
    _done_if: str | Condition | None
    outputs: tuple[str, ...]
    plan: str | None  # the plan and the job's own hash: `plan@hash`
    _shape: _Shape

    def __init__(
        self,
        name: str,
        lane: str,
        body: str,
        requires: str | None = None,
        done_if: str | None = None,
        retries: int = 1,
        timeout_s: float | None = None,
        warn_after_s: float | None = None,
        outputs: tuple[str, ...] = (),
        plan: str | None = None,
        keys: tuple[str, ...] = (),
        gpus: int = 1,
        expect_wait: tuple[tuple[str, float], ...] = (),
        priority: int = 0,
        filename: str | None = None,
    ) -> None:
        shape = (lane, retries, timeout_s, warn_after_s, keys, gpus, expect_wait, priority)
        kept = _SHAPES.get(shape)
        if kept is None:
            kept = shape
            if len(_SHAPES) < 1000:
                _SHAPES[shape] = shape
        filename = filename if filename is not None else name + ".job"
        for slot, value in zip(self.__slots__, (filename, body, requires, done_if, outputs, plan, kept)):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a JobFile is immutable: cannot set {name}")

    @property
    def name(self) -> str:
        return self.filename[:-4]

    @property
    def lane(self) -> str:
        return self._shape[0]

    @property
    def retries(self) -> int:
        return self._shape[1]

    @property
    def timeout_s(self) -> float | None:
        return self._shape[2]

    @property
    def warn_after_s(self) -> float | None:
        return self._shape[3]

    @property
    def keys(self) -> tuple[str, ...]:
        return self._shape[4]

    @property
    def gpus(self) -> int:
        return self._shape[5]

    @property
    def expect_wait(self) -> tuple[tuple[str, float], ...]:
        return self._shape[6]

    @property
    def priority(self) -> int:
        return self._shape[7]

    @property
    def requires(self) -> str | None:
        value = self._requires
        return value if value is None or isinstance(value, str) else value.text

    @property
    def done_if(self) -> str | None:
        value = self._done_if
        return value if value is None or isinstance(value, str) else value.text

    def header(self, requires: Condition | None, done_if: Condition | None, outputs: tuple[str, ...]) -> JobFile:
        """This job without its body (bash reads the file itself), its REQUIRES and DONE_IF kept as the compiled
        conditions of their texts and its OUTPUTS as the equal strings given (the queue's jobs then share one of
        each). Its PLAN is the plan's name alone, `NAME@` (one string for the plan's jobs): what the runner reads of
        it (the end events' plan, whether it is a plan job); the per-job hash after the `@` was 6.5 MB at 100,000."""
        job = JobFile.__new__(JobFile)
        for slot, value in (
            ("filename", self.filename),
            ("body", ""),
            ("_requires", requires),
            ("_done_if", done_if),
            ("outputs", outputs),
            ("plan", sys.intern("".join(self.plan.partition("@")[:2])) if self.plan else self.plan),
            ("_shape", self._shape),
        ):
            object.__setattr__(job, slot, value)
        return job

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        return self._values() == other._values() if isinstance(other, JobFile) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "JobFile(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS) + ")"


class Invalid(NamedTuple):
    """Why a job file must never be executed; `line` is 1-based where one line is to blame. (A NamedTuple: a push's
    agent, which parses every job it installs, then loads no dataclasses.)"""

    reason: str
    line: int | None = None

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}" if self.line else self.reason


def job_name(filename: str) -> str:
    return filename[:-4] if filename.endswith(".job") else filename


def parse(filename: str, data: bytes, lanes: Sequence[str] = DEFAULT_LANES) -> JobFile | Invalid:
    """The job in DATA (the bytes of FILENAME), or the precise reason it is not runnable."""
    name = job_name(filename)
    if not filename.endswith(".job"):
        return Invalid(f"job file name {filename!r} does not end in .job")
    if not NAME_RE.fullmatch(name) or ".." in name:
        return Invalid(f"bad job name {name!r}: use letters, digits, '.', '_' and '-', not starting with '.' or '-'")
    text = _text(data)
    if isinstance(text, Invalid):
        return text
    if text.startswith(BOM):  # a Windows editor's byte order mark: the header is read after it
        text = text[1:]
    lines = text.split("\n")
    found = _header(lines)
    if isinstance(found, Invalid):
        return found
    header, header_lines, body_start = found
    stray = None if header else _stray_header(lines, body_start)
    if stray is not None:
        return stray
    body = "\n".join(lines[body_start:])
    if not any(ln.strip() and not ln.lstrip().startswith("#") for ln in lines[body_start:]):
        return Invalid("no command after the header: nothing to run")
    return _typed(filename, header, header_lines, body, lanes)


def _text(data: bytes) -> str | Invalid:
    """DATA as text bash will read as we do: not empty, no NUL, UTF-8, no carriage return."""
    if not data.strip():
        return Invalid("empty file" if not data else "file holds only whitespace")
    if b"\0" in data:
        return Invalid("file contains a NUL byte")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Invalid(f"not valid UTF-8 at byte {exc.start}")
    if "\r" in text:
        crlf_line = text[: text.index("\r")].count("\n") + 1
        return Invalid("carriage return (CRLF line ends?): bash would see the \\r as part of the command", crlf_line)
    return text


def _header(lines: list[str]) -> tuple[dict[str, str], dict[str, int], int] | Invalid:
    """The header's keys and values, the line of each, and where the body starts: the first line that is not a
    comment (a `#!` first line is skipped)."""
    header: dict[str, str] = {}
    header_lines: dict[str, int] = {}
    for index, line in enumerate(lines):
        if index == 0 and line.startswith("#!"):
            continue
        if not line.startswith("#"):
            return header, header_lines, index
        problem = _header_line(line, index + 1, header, header_lines)
        if problem is not None:
            return problem
    return header, header_lines, len(lines)


def _stray_header(lines: list[str], body_start: int) -> Invalid | None:
    """In a file with no header at its top: a header line where the header is not read (after a blank line, a
    space, an invisible character, before the first command). The job would run without it, at once and in the
    default lane: invalid. (Below a header, such a comment is the body's own, as the compiler writes it.)"""
    for index in range(body_start, len(lines)):
        line = lines[index]
        seen = _visible(line).strip()
        if not seen:
            continue
        if not seen.startswith("#"):
            return None  # the first command: comments after it are the body's own
        match = _KEY_LINE.match(seen)
        if match and match.group(1) in HEADER_KEYS:
            return Invalid(
                f"header line {line!r} is not at the top of the file (the header is the first lines, each "
                "starting with '#', nothing before them): the runner would ignore it; move it up",
                index + 1,
            )
    return None


def _visible(line: str) -> str:
    """LINE without format characters (zero-width spaces and joiners, BOMs, bidi marks): what a reader sees."""
    if line.isascii():
        return line
    import unicodedata  # only for a line that is not ASCII

    return "".join(c for c in line if unicodedata.category(c) != "Cf").replace("\u00a0", " ")


def _header_line(line: str, lineno: int, header: dict[str, str], header_lines: dict[str, int]) -> Invalid | None:
    """One comment line of the header: a `# KEY=VALUE` is added to HEADER; a comment is passed over."""
    match = _KEY_LINE.match(line)
    if not match:
        if _KEYISH_LINE.match(line):
            return Invalid(f"malformed header line {line!r}: write '# KEY=VALUE'", lineno)
        return None
    key, value = match.group(1), match.group(2).strip()
    if key not in HEADER_KEYS:
        import difflib  # only for a bad job file: every agent call and Slurm wrapper imports this module

        hint = difflib.get_close_matches(key.upper(), HEADER_KEYS, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        return Invalid(f"unknown header key {key}{suggestion}; known keys: {', '.join(HEADER_KEYS)}", lineno)
    if key in header:
        return Invalid(f"header key {key} given twice (first on line {header_lines[key]})", lineno)
    if not value:
        return Invalid(f"header key {key} has an empty value", lineno)
    key = HEADER_KEYS[HEADER_KEYS.index(key)]  # the one string of that name, not one per queued job
    header[key] = value
    header_lines[key] = lineno
    return None


def _typed(
    filename: str, header: dict[str, str], where: dict[str, int], body: str, lanes: Sequence[str]
) -> JobFile | Invalid:
    lane = sys.intern(header.get("LANE", DEFAULT_LANE))  # one string per lane name, not per queued job
    if lane not in lanes:
        return Invalid(f"unknown LANE {lane!r}; this runner's lanes are {', '.join(lanes)}", where.get("LANE"))
    retries = 1
    if "RETRIES" in header:
        try:
            retries = int(header["RETRIES"])
        except ValueError:
            return Invalid(f"RETRIES must be a whole number, not {header['RETRIES']!r}", where["RETRIES"])
        if retries < 1:
            return Invalid("RETRIES must be at least 1 (it counts attempts)", where["RETRIES"])
    priority = 0
    if "PRIORITY" in header:
        try:
            priority = int(header["PRIORITY"])
        except ValueError:
            return Invalid(f"PRIORITY must be a whole number, not {header['PRIORITY']!r}", where["PRIORITY"])
    durations: dict[str, float | None] = {"TIMEOUT": None, "WARN_AFTER": None}
    for key in durations:
        if key in header:
            try:
                durations[key] = parse_limit(key, header[key])
            except ValueError as exc:
                return Invalid(f"{key}: {exc}", where[key])
    gpus = 1
    if "GPUS" in header:
        text = header["GPUS"]
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_GPUS:
            return Invalid(f"GPUS must be a whole number from 1 to {MAX_GPUS}, not {text!r}", where["GPUS"])
        gpus = int(text)
    outputs: tuple[str, ...] = ()
    if "OUTPUTS" in header:
        try:
            outputs = tuple(shlex.split(header["OUTPUTS"]))
        except ValueError as exc:
            return Invalid(f"OUTPUTS is not a list of shell words: {exc}", where["OUTPUTS"])
    expect_wait: tuple[tuple[str, float], ...] = ()
    if "EXPECT_WAIT" in header:
        try:
            expect_wait = parse_expect_wait(header["EXPECT_WAIT"])
        except ValueError as exc:
            return Invalid(f"EXPECT_WAIT: {exc}", where["EXPECT_WAIT"])
    return JobFile(
        name=job_name(filename),
        filename=filename,
        lane=lane,
        body=body,
        requires=header.get("REQUIRES"),
        done_if=header.get("DONE_IF"),
        retries=retries,
        timeout_s=durations["TIMEOUT"],
        warn_after_s=durations["WARN_AFTER"],
        outputs=outputs,
        plan=header.get("PLAN"),
        keys=_KEY_SETS.setdefault(tuple(header), tuple(header)) if len(_KEY_SETS) < 1000 else tuple(header),
        gpus=gpus,
        expect_wait=expect_wait,
        priority=priority,
    )


def parse_expect_wait(text: str) -> tuple[tuple[str, float], ...]:
    """`2d` (a wait on anything) or `requires=2d,gpu-foreign=1h` (per reason): ((reason or "*", seconds), ...)."""
    from runner.vocab import REASON_NAMES

    found: list[tuple[str, float]] = []
    for item in text.split(","):
        reason, sep, value = item.strip().rpartition("=")
        reason = reason.strip() if sep else "*"
        if reason != "*" and reason not in REASON_NAMES:
            raise ValueError(f"{reason!r} is not a reason a job waits on (reasons: {', '.join(sorted(REASON_NAMES))})")
        if any(r == reason for r, _ in found):
            raise ValueError(f"{reason if reason != '*' else 'the default'} given twice")
        found.append((reason, parse_duration(value)))
    return tuple(found)


# Header key -> the job-file format (status.json's format_version) that first reads it.
KEYS_SINCE = {"GPUS": 2, "EXPECT_WAIT": 2, "PRIORITY": 2}


def format_needed(text: str) -> int:
    """The oldest job-file format that reads TEXT's header (1 for every key a first-format runner knows)."""
    needed = 1
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        match = _KEY_LINE.match(line)
        if match:
            needed = max(needed, KEYS_SINCE.get(match.group(1), 1))
    return needed


def format(
    *,
    lane: str,
    body: str,
    requires: str | None = None,
    done_if: str | None = None,
    retries: int | None = None,
    timeout: str | None = None,
    warn_after: str | None = None,
    outputs: Sequence[str] = (),
    plan: str | None = None,
    comment: str | None = None,
    gpus: int | None = None,
    expect_wait: str | None = None,
    priority: int | None = None,
    sign: Callable[[str], str] | None = None,
) -> str:
    """A job file's text: the header in contract order, an optional comment line, the body (SIGN: PLAN of the rest)."""
    values = {
        "LANE": lane,
        "REQUIRES": requires,
        "DONE_IF": done_if,
        "RETRIES": None if retries is None else str(retries),
        "TIMEOUT": timeout,
        "WARN_AFTER": warn_after,
        "OUTPUTS": " ".join(shlex.quote(p) for p in outputs) if outputs else None,
        "EXPECT_WAIT": expect_wait,
        "PLAN": plan,
        "GPUS": None if gpus is None else str(gpus),
        "PRIORITY": None if not priority else str(priority),  # 0 is the default: no line, the file as before
    }
    lines: list[str] = []
    for key in HEADER_KEYS:
        if key == "PLAN" and sign is not None:
            plan_at = len(lines)
        elif (value := values[key]) is not None:
            lines.append(_one_line(key, value))
    if comment:
        # The comment line is inside the script: a newline in it would start a command.
        if "\n" in comment or "\r" in comment:
            raise ValueError(f"the header comment must be one line: {comment!r}")
        lines.append(f"# {comment}")
    text = "\n".join(lines) + "\n" + body
    if sign is not None:  # the compiler's `name@digest`, of the text without its line
        lines.insert(plan_at, _one_line("PLAN", sign(text if text.endswith("\n") else text + "\n")))
        text = "\n".join(lines) + "\n" + body
    return text if text.endswith("\n") else text + "\n"


def _one_line(key: str, value: str) -> str:
    if "\n" in value or "\r" in value or not value.strip():
        raise ValueError(f"header value for {key} must be one non-empty line: {value!r}")
    return f"# {key}={value}"
