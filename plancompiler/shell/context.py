"""Stage 4's escaper: which shell quoting context each `{{ }}` of a job template stands in, and its escape.

A jinja extension has the template's literal text read the way bash would read it (shellscan) and
rewrites every `{{ expr }}` to `{{ (expr) | _esc(context, ...) }}`, so that a value is data in every
context. Where the context cannot be decided (`$(( ))`, backticks, `${ }`,
`eval`, `bash -c`, `ssh`, `trap`, a heredoc fed to an interpreter, `{% call %}`), the template is refused with
the expression's line and column; where bash reads a variable name (`printf -v`, `unset`, `read`, `[[ -v ]]`)
the value must be a plain name.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.lexer import Token, TokenStream

from plancompiler.sandbox import BoundedSandbox, Limits
from plancompiler.shell.scan import EXPR, TAG, Scanner, Site
from plancompiler.shell.tables import CODE_BUILTINS

# Heredoc values are framed by these (a value can hold neither) so the rendered job can be checked
# for a line that a value turned into the heredoc's end.
HEREDOC_OPEN, HEREDOC_CLOSE = "\x02", "\x03"


class ContextError(jinja2.TemplateSyntaxError):
    """A template whose `{{ }}` stand where no escaping can make a value data; every place is listed."""

    def __init__(self, problems: list[tuple[int, int, str]], name: str | None) -> None:
        line, col, message = problems[0]
        super().__init__(message, line, name, None)
        self.problems = problems
        self.col = col


class ValueRefused(Exception):
    """A value that cannot be written into its context (NUL, CR, a newline in a comment)."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col = line, col


class Shell(str):
    """A value the template marks as shell code on purpose (`{{ x | sh }}`): written as it is."""


def _columns(source: str) -> dict[int, list[int]]:
    """1-based columns of each `{{`/`{%` on each line, in order, for locating placeholders."""
    found: dict[int, list[int]] = {}
    for number, line in enumerate(source.split("\n"), 1):
        found[number] = [m.start() + 1 for m in re.finditer(r"\{\{|\{%", line)]
    return found


def _placeholders(
    tokens: list[Token], columns: dict[int, list[int]]
) -> tuple[str, list[tuple[int, int, bool, Any]], list[tuple[int, int]]] | None:
    """The template's literal text with one placeholder per `{{ }}` (EXPR) and `{% %}` (TAG), each one's
    (line, col, is_sh, tag) and each `{{ }}`'s token range; None where a tag is not closed."""
    used: dict[int, int] = {}

    def col_of(line: int) -> int:
        cols = columns.get(line, [])
        k = used.get(line, 0)
        used[line] = k + 1
        return cols[k] if k < len(cols) else 1

    text: list[str] = []
    places: list[tuple[int, int, bool, Any]] = []
    exprs: list[tuple[int, int]] = []  # token index ranges of each {{ }}
    saved: list[Any] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == "data":
            text.append(tok.value.replace(EXPR, " ").replace(TAG, " "))
        elif tok.type in ("variable_begin", "block_begin"):
            end = "variable_end" if tok.type == "variable_begin" else "block_end"
            j = i
            while j < len(tokens) and tokens[j].type != end:
                j += 1
            if j == len(tokens):
                return None
            if tok.type == "variable_begin":
                inner = tokens[i + 1 : j]
                is_sh = len(inner) >= 2 and inner[-2].type == "pipe" and inner[-1].test("name:sh")
                program = len(inner) >= 2 and inner[-2].type == "pipe" and inner[-1].test("name:program")
                places.append((tok.lineno, col_of(tok.lineno), is_sh, "program" if program else None))
                exprs.append((i, j))
                text.append(EXPR)
                i = j
            else:
                name = tokens[i + 1].value if i + 1 < len(tokens) else ""
                has_assign = any(t.type == "assign" for t in tokens[i:j])
                places.append((tok.lineno, col_of(tok.lineno), False, (name, has_assign, saved)))
                text.append(TAG)
        i += 1
    return "".join(text), places, exprs


class ShellContext(Extension):
    """Rewrites each `{{ expr }}` to `{{ (expr) | _esc(context, line, col, delim, dash) }}`."""

    def filter_stream(self, stream: TokenStream) -> Iterator[Token]:
        tokens = list(stream)
        source = self._source(stream.name)
        read = _placeholders(tokens, _columns(source) if source is not None else {})
        if read is None:
            yield from tokens  # unclosed: jinja's parser reports it, with its line
            return
        text, places, exprs = read
        scanner = Scanner()
        scanner.scan(text, places)
        last = tokens[-1].lineno if tokens else 1
        scanner.finish(last)
        if scanner.problems:
            problems = [(ln or last, col or 1, msg) for ln, col, msg in scanner.problems]
            raise ContextError(sorted(set(problems)), stream.name)
        yield from self._rewrite(tokens, exprs, scanner.sites)

    def _source(self, name: str | None) -> str | None:
        loader = self.environment.loader
        if loader is None or name is None:
            return None
        try:
            return loader.get_source(self.environment, name)[0]
        except jinja2.TemplateNotFound:
            return None

    @staticmethod
    def _rewrite(tokens: list[Token], exprs: list[tuple[int, int]], sites: list[Site]) -> Iterator[Token]:
        starts = {begin: (end, site) for (begin, end), site in zip(exprs, sites, strict=True)}
        i = 0
        while i < len(tokens):
            if i not in starts:
                yield tokens[i]
                i += 1
                continue
            end, site = starts[i]
            ln = tokens[i].lineno
            yield tokens[i]
            yield Token(ln, "lparen", "(")
            yield from tokens[i + 1 : end]
            yield Token(ln, "rparen", ")")
            yield Token(ln, "pipe", "|")
            yield Token(ln, "name", "_esc")
            yield Token(ln, "lparen", "(")
            args: tuple[Any, ...] = (site.context, site.line, site.col, site.delim, int(site.dash), site.check)
            for n, value in enumerate(args):
                if n:
                    yield Token(ln, "comma", ",")
                yield Token(ln, "string" if isinstance(value, str) else "integer", value)
            yield Token(ln, "rparen", ")")
            yield tokens[end]
            i = end + 1


class Escaped(str):
    """Text already escaped for its place in the job: the only kind the renderer writes."""


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(_text(v) for v in value)
    return str(value)


def escape(value: Any, context: str, line: int, col: int, delim: str = "", dash: int = 0, check: str = "") -> Escaped:
    """VALUE written so that bash reads it back byte for byte in CONTEXT (or as code, for | sh). CHECK: the
    value must be a plain variable name (name), or must not start a ( ) compound assignment (decl)."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises here, at the template's line
    words = value if isinstance(value, (list, tuple)) and not isinstance(value, Shell) else [value]
    texts = [_text(w) for w in words] if context in ("bare", "cond") else [_text(value)]
    for text in texts:
        _refuse_bytes(text, line, col)
    if context == "sh" or isinstance(value, Shell):
        return Escaped(texts[0])
    _check(check, texts, line, col)
    if context == "bare":
        return Escaped(" ".join(shlex.quote(t) for t in texts))
    if context == "cond":
        return Escaped(" ".join("'" + t.replace("'", "'\\''") + "'" for t in texts))
    return _quoted(texts[0], context, line, col, delim, dash)


def _refuse_bytes(text: str, line: int, col: int) -> None:
    for bad, what in (
        ("\0", "a NUL byte"),
        ("\r", "a carriage return (CRLF)"),
        (HEREDOC_OPEN, "a control character"),
        (HEREDOC_CLOSE, "a control character"),
    ):
        if bad in text:
            raise ValueRefused(line, col, f"the value holds {what}, which a job file cannot carry: {_preview(text)}")


def _check(check: str, texts: list[str], line: int, col: int) -> None:
    """The escaper's name/decl check of the value's words TEXTS (the last one is shown in the message)."""
    joined = " ".join(texts)
    shown = texts[-1] if texts else ""  # an empty list as a name is refused too (it was an internal error)
    if check == "name" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", joined):
        raise ValueRefused(
            line,
            col,
            "the value stands where bash reads a variable name, whose [ ] subscript "
            f"it would evaluate as code; it must be a plain name (letters, digits, _): {_preview(shown)}",
        )
    first = texts[0] if texts else ""
    if check in ("program", "program-in"):
        _check_program(first, check == "program", line, col)
    if check == "decl" and joined.startswith("("):
        raise ValueRefused(
            line,
            col,
            "the value starts with ( where declare/local would read it as a compound "
            f"array assignment and run what it holds: {_preview(shown)}",
        )


def _check_program(name: str, starts: bool, line: int, col: int) -> None:
    """A value marked | program: a name that runs that program and nothing else. STARTS: it starts its word."""
    why = ""
    if "=" in name:
        why = "holds =, which env and sudo read as a variable to set (env BASH_ENV=... runs code)"
    elif starts and name.startswith("-"):
        why = "starts with -, which the command before it would read as an option (env -S runs code)"
    elif starts and name.startswith("%"):
        why = "starts with %, which bash runs as fg, a job spec, whatever its quotes"
    elif starts and name in CODE_BUILTINS:
        why = "names a shell builtin, which a quoted name still runs, and which runs or names what follows"
    if why:
        raise ValueRefused(
            line, col, f"a program marked | program {why}: name a program by its path (/usr/bin/...): {_preview(name)}"
        )


def _quoted(text: str, context: str, line: int, col: int, delim: str, dash: int) -> Escaped:
    """TEXT written inside double or single quotes, a comment, or a heredoc body."""
    if context == "dq":
        return Escaped(re.sub(r'([\\$`"])', r"\\\1", text))
    if context == "sq":
        return Escaped(text.replace("'", "'\\''"))
    if context == "comment":
        if "\n" in text:
            raise ValueRefused(line, col, f"a value with a newline cannot go in a # comment: {_preview(text)}")
        return Escaped(text)
    if context in ("heredoc", "qheredoc"):
        body = re.sub(r"([\\$`])", r"\\\1", text) if context == "heredoc" else text
        return Escaped(f"{HEREDOC_OPEN}{int(dash)}{line}:{col}:{delim}{HEREDOC_CLOSE}{body}{HEREDOC_CLOSE}")
    raise ValueError(f"unknown quoting context {context!r}")


def _preview(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


_FRAME = re.compile(
    HEREDOC_OPEN + r"([01])(\d+):(\d+):([^" + HEREDOC_CLOSE + "]*)" + HEREDOC_CLOSE + "(.*?)" + HEREDOC_CLOSE, re.S
)


def finish_heredocs(body: str) -> tuple[str, tuple[int, int, str] | None]:
    """BODY without the heredoc frames, and (line, col, problem) if a value made a line that ends its heredoc."""
    if HEREDOC_OPEN not in body:
        return body, None
    out: list[str] = []
    spans: list[tuple[int, int, str, bool, int, int]] = []  # where each value landed in the clean text
    size = last = 0
    for match in _FRAME.finditer(body):
        out.append(body[last : match.start()])
        size += match.start() - last
        dash, line, col, delim, value = match.groups()
        spans.append((size, size + len(value), delim, dash == "1", int(line), int(col)))
        out.append(value)
        size += len(value)
        last = match.end()
    out.append(body[last:])
    text = "".join(out)
    for start, end, delim, dash, line_no, col in spans:
        first = text.rfind("\n", 0, start) + 1
        stop = text.find("\n", end)
        at = first
        for line in text[first : len(text) if stop == -1 else stop].split("\n"):
            if (line.lstrip("\t") if dash else line) == delim:
                return text, (
                    line_no,
                    col,
                    f"the value makes the line {delim!r}, which would end its heredoc "
                    "early and run the rest as commands",
                )
            tabs = len(line) - len(line.lstrip("\t"))
            if dash and tabs and at + tabs > start and at < end:
                return text, (
                    line_no,
                    col,
                    "the value puts a tab at the start of a line of a <<- heredoc, which bash would remove",
                )
            at += len(line) + 1
    return text, None


def _written(value: Any) -> Any:
    """Every `{{ }}` is rewritten to pass through the escaper; anything else reaching here is a bug."""
    if isinstance(value, Escaped):
        return value
    raise RuntimeError(f"internal error: an unescaped value reached a job: {value!r}")


def shell_environment(limits: Limits | None = None, **kwargs: Any) -> BoundedSandbox:
    """The sandbox that renders shell text (job bodies, `sh:` requirements) with every value escaped."""
    env = BoundedSandbox(
        limits, extensions=[ShellContext], finalize=_written, auto_reload=False, cache_size=-1, **kwargs
    )
    env.filters["sh"] = lambda value: Shell(
        " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    )
    env.filters["q"] = lambda value: value  # every value is quoted for its place; kept for old templates
    env.filters["program"] = lambda value: value  # a trusted program's name: escaped as data, allowed to run
    env.filters["_esc"] = escape
    return env
