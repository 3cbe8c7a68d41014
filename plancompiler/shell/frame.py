"""Stage 4's shell reader, its state: one frame per open quoting (a command, quotes, a heredoc, `$(( ))`), and
what each `{{ }}` is given (a Site); shared by the scanner (shellscan) and its placeholders (shellplaces)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from plancompiler.shell.commands import EXPR

TAG = "\x01"  # placeholder for `{% %}` in the scanned text (EXPR, "\x00", stands for `{{ }}`)


@dataclass
class Frame:
    kind: str  # cmd, dq, sq, heredoc, opaque
    closer: str = ""  # cmd: ")" inside $( ); opaque: what ends it
    reason: str = ""  # opaque: why a value cannot go here
    depth: int = 0  # cmd: open ( ; opaque: nesting
    delim: str = ""  # heredoc
    dash: bool = False  # heredoc: <<- strips leading tabs
    quoted: bool = False  # heredoc: <<'EOF' (no expansion)
    words: list[str] = field(default_factory=list)  # cmd: the current simple command's finished words
    word: str = ""  # cmd: the word being read
    comment: bool = False  # cmd: inside a # comment
    code: str = ""  # heredoc: why its body is code (the command it feeds is an interpreter)
    word_expr: tuple[int, int] | None = None  # cmd: where a value stands in the word being read
    last_expr: tuple[int, int] | None = None  # cmd: where a value stood in the last finished word
    line: str = ""  # heredoc: the current line so far
    line_expr: bool = False  # heredoc: the current line holds a value
    cond: bool = False  # cmd: inside [[ ]], where && || ( ) are the test's operators, not the command's end
    array: bool = False  # cmd: the elements of a compound array assignment a=( ... )
    heredocs: list[int] = field(default_factory=list)  # cmd: pending heredocs of this command, decided at its end
    strings: list[tuple[int, int]] = field(default_factory=list)  # cmd: values in this command's here-strings
    values: list[tuple[int, int]] = field(default_factory=list)  # cmd: values in this command (nested ones too)
    piped: list[tuple[int, int]] = field(default_factory=list)  # cmd: values of the pipeline's earlier commands
    piped_docs: list[int] = field(default_factory=list)  # cmd: their heredocs (pending indices)
    alts: list[tuple[list[str], list[str]]] = field(default_factory=list)  # cmd: other {% if %} branches' words
    procsub: bool = False  # cmd: the inside of <( ): its output is a file the outer command reads
    seen: list[tuple[int, int]] = field(default_factory=list)  # cmd: every value in this frame, in order
    marks: list[int] = field(default_factory=list)  # cmd: len(seen) at each open { ( if for while until case
    closed: list[tuple[int, int]] = field(default_factory=list)  # cmd: the values of the compound just closed
    pattern: bool = False  # cmd: reading a case pattern (after `in` or `;;`, before its `)`)
    func: tuple[str, int] | None = None  # cmd: a function being defined: its name, len(marks) at `name()`
    alt_cut: int = 0  # cmd: how much of `word` was read before the branches closed (alts have their own start)


@dataclass
class Site:
    line: int
    col: int
    context: str  # bare, dq, sq, heredoc, qheredoc, comment, sh
    delim: str = ""
    dash: bool = False
    check: str = ""  # name: the value must be a plain variable name; decl: must not start a ( ) array


def signature(stack: list[Frame], pending: list[tuple[str, bool, bool, str]]) -> tuple[Any, ...]:
    return tuple((f.kind, f.closer, f.delim, f.comment, f.quoted, f.cond, f.array) for f in stack) + (tuple(pending),)


class ScanState(Protocol):
    """What the placeholders (shellplaces) read and change of the scanner (shellscan.Scanner)."""

    stack: list[Frame]
    pending: list[tuple[str, bool, bool, str]]  # heredocs whose bodies start at the next newline
    sites: list[Site]
    problems: list[tuple[int, int, str]]
    integers: set[str]
    confused: bool


def words_now(stack: list[Frame]) -> list[tuple[list[str], str]]:
    """The words (and the word being read) of the command in STACK so far, then the other branches' ones:
    a value after the branches is judged under each (`{% if x %}eval{% else %}echo{% endif %} {{ v }}`)."""
    cmd = next(f for f in reversed(stack) if f.kind == "cmd")
    return [(list(cmd.words), cmd.word)] + [(list(w), p[0] + cmd.word[cmd.alt_cut :]) for w, p in cmd.alts]


def skip(text: str, i: int) -> int:
    """Past the backslash at I and the character it escapes, unless that is a placeholder."""
    return i + 1 if i + 1 < len(text) and text[i + 1] in (EXPR, TAG) else i + 2
