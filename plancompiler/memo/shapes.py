"""Lint once per shape: each job rendered again with its data values as placeholders; equal skeletons share a lint.

Most plans are a few templates times many rows: the same shell text with different quoted data. Each job
is rendered a second time with every escaped value replaced by a placeholder that keeps what shellcheck
and `bash -n` can see of it: its quoting context, its words, the punctuation between its runs of word
characters, a number's range, and which values of the job are equal. A value where more could matter (a
bare word that could be a command name or keyword, an option, a system path, quotes, `$`, `%`, globs, a
newline, shell code from `| sh`) stays in the skeleton as it is. Placeholders never change a line, so a
finding on skeleton line N is one on the job's body line N; its column and any placeholder its message
quotes are mapped back through the recorded spans. A job whose skeleton cannot be shown to rebuild its
real text exactly (values captured by `{% set %}` blocks or macros, a render that fails) is its own shape.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancompiler.render import _INLINE, RenderedJob, Renderer
from plancompiler.sandbox import Limits
from plancompiler.shell import HEREDOC_CLOSE, Escaped, Shell, escape

_OPEN, _SEP = "\x05", "\x06"  # frame a placeholder in the shape render: (index, placeholder)
_MARK = re.compile(_OPEN + r"(\d+|k)" + _SEP + "([^" + _SEP + "]*)" + _SEP)  # k: a data value kept as itself
_WORD_CHARS = re.compile(r"[A-Za-z0-9_./:@+,-]+")
_TEXT_CHARS = re.compile(r"[A-Za-z0-9_./:@+, -]+")
_RUN = re.compile(r"[A-Za-z0-9_]+")
_BARE_WORD = r"(?:'[^']*'|[^ ']+)"  # shlex.quote's output: one quoted word, or a word of safe characters
_BARE_WORDS = re.compile(rf"{_BARE_WORD}(?: {_BARE_WORD})*")
_BARE_SPLIT = re.compile(_BARE_WORD)
_STAND_IN = re.compile(r"zq\d+z")
SKELETON_PREFIX = "#\n"  # stands for the header: comments only, never a shellcheck directive


@dataclass(frozen=True)
class Shape:
    """A job's skeleton (what is linted, once per distinct text) and how to map findings back to the job."""

    job: RenderedJob
    text: str  # SKELETON_PREFIX + the body with placeholders
    line_offset: int  # skeleton line N is job line N + line_offset
    parts: tuple[str, ...] = ()  # the skeleton after the prefix: text, placeholder, text, placeholder, ..., text
    reals: tuple[str, ...] = ()  # the job's text for each placeholder, in order

    def spans(self) -> list[tuple[int, int, int, str]]:
        """Each placeholder as (skeleton line, 1-based column, length, the job's text there)."""
        found = []
        line, line_start, at = 2, len(SKELETON_PREFIX), len(SKELETON_PREFIX)
        for i, part in enumerate(self.parts):
            if i % 2:
                found.append((line, at - line_start + 1, len(part), self.reals[i // 2]))
            elif "\n" in part:
                line += part.count("\n")
                line_start = at + part.rindex("\n") + 1
            at += len(part)
        return found

    def job_col(self, line: int, col: int) -> int:
        """The job's column for skeleton (LINE, COL): shifted by the placeholders before it on that line."""
        shift = 0
        for span_line, span_col, size, real in self.spans():
            if span_line != line or span_col > col:
                continue
            if col < span_col + size:
                return span_col + shift  # inside a placeholder: the start of the value
            shift += len(real) - size
        return col + shift

    def job_message(self, message: str) -> str:
        """MESSAGE with each placeholder it quotes replaced by the job's own text."""
        if not self.reals:
            return message
        names = dict(zip(self.parts[1::2], self.reals, strict=True))
        pattern = "|".join(re.escape(p) for p in sorted(names, key=len, reverse=True))
        return re.sub(pattern, lambda m: names[m.group(0)], message)


class _Values:
    """Numbers each distinct escaped text of one job, so equal values get equal placeholders."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.real: list[str] = []

    def reset(self) -> None:
        self.ids.clear()
        self.real.clear()

    def id_of(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))


def _word(word: str, k: int) -> str | None:
    """The placeholder of one unquoted word (bare context), or None where the word itself may matter."""
    if not _WORD_CHARS.fullmatch(word) or word.startswith("-"):
        return None
    if word.isdigit():  # numbers: `exit`, `-eq` and friends judge the value's range
        if len(word) == 1:
            return None  # 0-9 name positional parameters (`0=1`)
        if word.startswith("0"):
            return _zero_padded(word, k)
        return str(100 + k) if int(word) <= 255 and k < 150 else (str(40000 + k) if int(word) > 255 else None)
    shape = _RUN.sub("a", word)
    if "a" not in shape:
        return None
    if shape == "a" and (word.isalpha() or not any(c.isdigit() for c in word) or word.isdigit()):
        return None  # a bare name could be a command or a keyword shellcheck knows
    stripped = word.rstrip("/")
    if word.startswith("/") and stripped.count("/") <= 2:
        return None  # /, /usr, /usr/local: rm -rf of them is a finding of its own
    return _RUN.sub(f"zq{k}z", word)


def _zero_padded(word: str, k: int) -> str | None:
    """A number with leading zeros (`000123`, a padded row number) as one that keeps what shellcheck judges of
    it: the leading 0 (octal), an 8 or 9 in it (SC2080: not octal), its value over 255 and its length over 5
    (`exit`/`return`: SC2242, SC2152)."""
    big, bad_octal = int(word) > 255, "8" in word or "9" in word
    if big:
        tail = f"9{k:02d}" if bad_octal else f"3{k:02o}"  # 900-999; 300-377
    else:
        tail = f"{k}9" if bad_octal else f"1{k:02o}"  # 09-249; 100-177
    if len(tail) > 3 or (not big and bad_octal and k >= 25):
        return None
    return "0" * (6 - len(tail) if len(word) > 5 else 1) + tail


def _text(text: str, k: int) -> str | None:
    """The placeholder of a quoted value's inside (dq, sq, heredoc), or None where its characters may matter."""
    if not text or not _TEXT_CHARS.fullmatch(text) or text.startswith("-") or text != text.strip():
        return None
    parts = text.split(" ")
    if "" in parts:
        return None
    out = []
    for part in parts:
        placeholder = (
            _word(part, k)
            if len(parts) == 1
            else (None if part.startswith("-") or "a" not in _RUN.sub("a", part) else _RUN.sub(f"zq{k}z", part))
        )
        if placeholder is None:
            return None
        out.append(placeholder)
    return " ".join(out)


def placeholder(context: str, real: str, k: int) -> str | None:
    """What stands for REAL (escaped for CONTEXT) in a skeleton; None keeps REAL itself."""
    if "\n" in real or "shellcheck" in real.lower():
        return None
    if context == "comment":
        return f"zq{k}z"
    if context in ("dq", "sq", "heredoc", "qheredoc"):
        return _text(real, k)
    if context in ("bare", "cond"):
        if not _BARE_WORDS.fullmatch(real):
            return None
        out = []
        for word in _BARE_SPLIT.findall(real):  # a quoted word may hold spaces: `'a b'` is one word
            if word.startswith("'"):
                inner = _text(word[1:-1], k) if len(word) >= 2 and word.endswith("'") else None
                placeholder_ = None if inner is None else f"'{inner}'"
            else:
                placeholder_ = _word(word, k)
            if placeholder_ is None:
                return None
            out.append(placeholder_)
        return " ".join(out)
    return None


def _shape_filter(values: _Values):
    escaped: dict[tuple[str, str, str, int], str] = {}  # most values recur: names, paths, the plan's vars
    stand_ins: dict[tuple[str, str, int], str | None] = {}

    def shape_escape(
        value: Any, context: str, line: int, col: int, delim: str = "", dash: int = 0, check: str = ""
    ) -> Escaped:
        if context == "sh" or isinstance(value, Shell) or check in ("name", "decl"):
            # code, or a value checked as a name: its own text is what shellcheck and bash must judge
            return escape(value, context, line, col, delim, dash, check)
        # a program's name (check "program"): its text is judged as any word's, so it may be a placeholder
        key = (value, context, delim, dash) if type(value) is str else None
        real = escaped.get(key) if key is not None else None
        if real is None:
            real = str(escape(value, context, line, col, delim, dash))
            if context in ("heredoc", "qheredoc"):
                real = real[real.index(HEREDOC_CLOSE) + 1 : -1]  # the value without its frame
            if key is not None:
                escaped[key] = real
        k = values.id_of(real)
        try:
            stand_in = stand_ins[(context, real, k)]
        except KeyError:
            stand_in = stand_ins[(context, real, k)] = placeholder(context, real, k)
        if _OPEN in real or _SEP in real:
            return Escaped(real)  # the job is its own shape (its text holds the frame)
        if stand_in is None:
            return Escaped(f"{_OPEN}k{_SEP}{real}{_SEP}")
        values.real.append(real)
        return Escaped(f"{_OPEN}{len(values.real) - 1}{_SEP}{stand_in}{_SEP}")

    return shape_escape


def _echoed(texts: Sequence[str], reals: set[str]) -> bool:
    """Whether the template's own text holds one of the values as a word: `{{ v }}=1; echo "$m1"` with v = m1
    assigns the variable it reads, and `[ "{{ v }}" = m1 ]` compares equal texts; a placeholder would not."""
    literal = "\0".join(texts)
    return any(
        real in literal and re.search(rf"(?<![A-Za-z0-9_]){re.escape(real)}(?![A-Za-z0-9_])", literal) for real in reals
    )  # the substring test first: a pattern per value would be compiled per job


def own(job: RenderedJob) -> Shape:
    """A job that is its own shape: its real body."""
    body = job.text.split("\n", job.header_lines)[-1] if job.header_lines else job.text
    return Shape(job, SKELETON_PREFIX + body, job.header_lines - 1)


def shapes(jobs: Sequence[RenderedJob], template_dirs: Sequence[Path], limits: Limits | None = None) -> list[Shape]:
    """Each job's shape, in order; a job is its own shape wherever the placeholders cannot be shown sound."""
    if not jobs:
        return []
    renderer = Renderer(template_dirs, [j.job for j in jobs], limits)
    values = _Values()
    renderer.escape = renderer.env.filters["_esc"] = _shape_filter(values)  # filters holds it bounded
    found = []
    for job in jobs:
        values.reset()
        found.append(_shape(job, renderer, values))
    return found


def _shape(job: RenderedJob, renderer: Renderer, values: _Values) -> Shape:
    body = job.text.split("\n", job.header_lines)[-1] if job.header_lines else job.text
    if job.header_lines < 1 or _OPEN in job.text or _SEP in job.text or _STAND_IN.search(body):
        # a job's own text that looks like a placeholder could make unequal values look equal
        return own(job)
    spec = job.job.job
    name = spec.template if spec.template is not None else f"{_INLINE}{job.job.index}"
    try:
        template = renderer.template(name)
        framed = renderer.render(name, template, job.job.context, job.name, values.reset)
    except Exception:
        return own(job)
    pieces = _MARK.split(framed)  # text, index, placeholder, text, ...
    literal = pieces[0::3]  # the template's own text, code (| sh) and names: what may refer to a value
    parts, reals, kept = [pieces[0]], [], set()
    for index, stand_in, text in zip(pieces[1::3], pieces[2::3], pieces[3::3], strict=True):
        if index == "k":  # a data value kept as itself: part of the text around the placeholders
            kept.add(stand_in)
            parts[-1] += stand_in + text
        else:
            reals.append(values.real[int(index)])
            parts += [stand_in, text]
    stand_ins = parts[1::2]
    if len(set(zip(stand_ins, reals, strict=True))) != len(set(stand_ins)):
        return own(job)  # one placeholder for two texts: equal-looking values that are not equal
    skeleton = "".join(parts)
    rebuilt = list(parts)
    rebuilt[1::2] = reals
    real_body = "".join(rebuilt)
    if real_body + "\n" == body:  # the job file always ends with a newline
        parts[-1] += "\n"
        skeleton += "\n"
    elif real_body != body:
        return own(job)  # a value reached the text another way (a set block, a macro): no mapping to trust
    if _echoed(literal, set(reals)) or not kept.isdisjoint(reals):
        # a kept data value is only ever data: it can equal a placeholder's text (a comparison of two
        # values), but never name or read a variable, so only whole equality counts there
        return own(job)
    return Shape(job, SKELETON_PREFIX + skeleton, job.header_lines - 1, tuple(parts), tuple(reals))
