"""Stage 4, render: sandboxed jinja2 bodies, each value escaped for its quoting context; headers by jobfile."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import os
import re
import shlex
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import SecurityError

from plancompiler.diagnostics import Diagnostic, display_path, error, warning
from plancompiler.expand import RESERVED, ExpandedJob
from plancompiler.graph import Graph
from plancompiler.load import Source
from plancompiler.models import Output, Requirement
from plancompiler.plainvalue import Body, body_of, render_body
from plancompiler.sandbox import LimitExceeded, Limits
from plancompiler.shell import ContextError, ValueRefused, escape, finish_heredocs, shell_environment
from runner import jobfile

_INLINE = "inline:"


@dataclass(frozen=True)
class RenderedJob:
    job: ExpandedJob
    text: str
    header_lines: int
    origin: str  # where the body came from: a template path or the plan path
    origin_line: int  # the line of the body's first line in ORIGIN
    body_lines_match: bool  # body line N is origin line origin_line + N - 1

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def filename(self) -> str:
        return self.job.filename


class Renderer:
    """One sandboxed jinja2 environment per compile: each template is compiled once, rendered per job."""

    def __init__(
        self, template_dirs: Sequence[Path], jobs: Sequence[ExpandedJob], limits: Limits | None = None
    ) -> None:
        self.template_dirs = [Path(d) for d in template_dirs]
        self.inline = {f"{_INLINE}{j.index}": j.job.run or "" for j in jobs if j.job.run is not None}
        loader = jinja2.ChoiceLoader(
            [
                jinja2.FunctionLoader(self._inline_source),
                jinja2.FileSystemLoader([str(d) for d in self.template_dirs]),
            ]
        )
        self.loader = loader
        self.env = shell_environment(limits, loader=loader)
        self.escape: Callable[..., str] = escape  # what each `{{ }}` passes through (the lint's shapes put theirs)
        self._names: dict[str, set[str] | None] = {}
        self._bodies: dict[str, Body | None] = {}
        self._templates: dict[str, jinja2.Template] = {}
        self._refused: dict[str, Exception] = {}

    def template(self, name: str) -> jinja2.Template:
        """Template NAME, compiled once: jinja's cache is asked once a name, not once a job. What fails fails once
        too, and is raised again for every job of that template (a refused body in a foreach of 1 000 rows was
        1 000 compiles, each failing alike)."""
        found = self._templates.get(name)
        if found is None:
            refused = self._refused.get(name)
            if refused is not None:
                raise refused.with_traceback(None)
            try:
                found = self._templates[name] = self.env.get_template(name)
            except (jinja2.TemplateError, RecursionError, LimitExceeded) as exc:
                self._refused[name] = exc
                raise
        return found

    def render(
        self,
        name: str,
        template: jinja2.Template,
        context: Mapping[str, Any],
        what: str,
        again: Callable[[], object] | None = None,
    ) -> str:
        """Template NAME's body over CONTEXT: without jinja where it is only text and values (plainvalue); AGAIN
        is called before jinja renders one the shortcut began (an escaper that keeps what it saw starts over)."""
        if name not in self._bodies:
            try:
                self._bodies[name] = body_of(self.env, self.loader.get_source(self.env, name)[0], name)
            except Exception:  # jinja reads it, and says what is wrong with it
                self._bodies[name] = None
        parsed = self._bodies[name]
        found = None if parsed is None else render_body(parsed, context, self.escape, self.env.limits.max_size)
        if found is not None:
            return found
        if parsed is not None and again is not None:
            again()
        return self.env.render_bounded(template, context, what)

    def _inline_source(self, name: str) -> tuple[str, str, Any] | None:
        if name in self.inline:
            return self.inline[name], name, lambda: True
        return None

    def template_path(self, name: str) -> Path | None:
        if not name or name.startswith("/") or ".." in Path(name).parts:
            return None  # templates are found under the template directories, nowhere else
        for directory in self.template_dirs:
            if (directory / name).is_file():
                return directory / name
        return None

    def names_used(self, name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """Every variable template NAME (and what it includes) reads; None where that cannot be known."""
        if name in self._names:
            return self._names[name]
        result: set[str] | None
        try:
            source = self.loader.get_source(self.env, name)[0]
            # Only parsed, never compiled: jinja folds constants when it compiles (`'a' * 10**10` too).
            tree = _PARSER.parse(source)
            result = {n.name for n in tree.find_all(nodes.Name) if n.ctx == "load"}
            for ref in meta.find_referenced_templates(tree):
                inner = None if ref is None or ref in seen else self.names_used(ref, seen | {name})
                if inner is None:
                    result = None
                    break
                result |= inner
        except (jinja2.TemplateError, LimitExceeded, RecursionError, OSError):
            result = None
        self._names[name] = result
        return result


_PARSER = jinja2.Environment()


def condition(requirements: Sequence[Requirement | Output], graph: Graph) -> str | None:
    """REQUIRES/DONE_IF text in the forms the runner evaluates without a fork."""
    parts = []
    for req in requirements:
        if req.kind == "sh":
            parts.append(req.value)
        elif req.kind == "after":
            target = graph.jobs.get(req.value)
            for out in target.outputs if target else ():
                parts.append(f"test -{out.test_op()} {shlex.quote(out.value)}")
        else:
            parts.append(f"test -{req.test_op()} {shlex.quote(req.value)}")
    return " && ".join(parts) if parts else None


def render_jobs(
    jobs: Sequence[ExpandedJob],
    graph: Graph,
    source: Source,
    plan_name: str,
    template_dirs: Sequence[Path],
    limits: Limits | None = None,
) -> tuple[list[RenderedJob], list[Diagnostic]]:
    renderer = Renderer(template_dirs, jobs, limits)
    rendered: list[RenderedJob] = []
    diagnostics: list[Diagnostic] = []
    comment = f"generated from {_shown_name(Path(source.path).name)} by plan; do not edit"
    files: dict[str, tuple[str, _Place] | str] = {}  # each template file found and read once: most jobs share one
    inline: dict[tuple[int, str], _Place] = {}  # each plan job's run placed once, not once per row of its foreach
    for job in jobs:
        name = job.job.template if job.job.template is not None else f"{_INLINE}{job.index}"
        if job.job.template is not None:
            file = files.get(job.job.template)
            if file is None:
                file = files[job.job.template] = _template_file(renderer, job.job.template)
            if isinstance(file, str):
                line, col = source.where(("jobs", job.index, "template"))
                diagnostics.append(error(source.path, line, col, "R001", file))
                continue
            template_source, place = file
        else:
            template_source = job.job.run or ""
            if (job.index, template_source) not in inline:
                inline[job.index, template_source] = _inline_place(source, job.index, template_source)
            place = inline[job.index, template_source]
        diagnostics.extend(_unused_with(job, renderer, name, source))
        body, found = _render_one(job, name, renderer, place)
        diagnostics.extend(found)
        if body is None:
            continue
        try:
            text, header = _with_header(job, body, graph, plan_name, comment)
        except ValueError as exc:  # a header value jobfile.format refuses (a newline in it): never written
            line, col = source.where(("jobs", job.index))
            diagnostics.append(error(source.path, line, col, "R010", f"job {job.name}: {exc}"))
            continue
        if len(text) > renderer.env.limits.max_size:
            line, col = source.where(("jobs", job.index))
            diagnostics.append(
                error(
                    source.path,
                    line,
                    col,
                    "R007",
                    f"job {job.name}: the job file would be "
                    f"{len(text):,} bytes, over the limit of {renderer.env.limits.max_size:,} "
                    "(raise it with plan --max-size)",
                )
            )
            continue
        matches = body.count("\n") == template_source.count("\n")
        rendered.append(RenderedJob(job, text, header, place.origin, place.line, matches))
    return rendered, diagnostics


def _template_file(renderer: Renderer, name: str) -> tuple[str, _Place] | str:
    """Template NAME's text and place, or why it has none."""
    path = renderer.template_path(name)
    if path is None:
        dirs = ", ".join(display_path(d) for d in renderer.template_dirs) or "(none)"
        return f"template {name!r} not found in {dirs}"
    try:
        return path.read_text(encoding="utf-8"), _Place(display_path(path), 1, 0)
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read template {path}: {exc}"


def _shown_name(name: str) -> str:
    """NAME as the job file's comment line may show it: as written if plain, else quoted with its escapes."""
    if name.isprintable() and "'" not in name and '"' not in name:
        return name
    return repr(name)  # repr escapes every newline and other non-printable character


@dataclass(frozen=True)
class _Place:
    """Where a template's text is: its file, the line of its first line there, and its indentation."""

    origin: str
    line: int
    indent: int
    tags: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = ()  # each {{ / {% of the body: where it is written

    def at(self, line: int, col: int) -> tuple[str, int, int]:
        for body, plan in self.tags:
            if body == (line, col):
                return self.origin, plan[0], plan[1]
        return self.origin, self.line + max(line, 1) - 1, max(col, 1) + (self.indent if col else 0)


@lru_cache(maxsize=64)
def _plan_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        return []


def _inline_place(source: Source, index: int, body: str) -> _Place:
    line, col = source.where(("jobs", index, "run"))
    lines = _plan_lines(source.path)
    tags = _tag_places(body, lines, line, col) if source.path.endswith((".yaml", ".yml")) else ()
    if col == 1 and 0 < line <= len(lines):  # a block scalar: its text starts after the indentation
        text = lines[line - 1]
        return _Place(source.path, line, len(text) - len(text.lstrip(" ")), tags)
    return _Place(source.path, line, col - 1, tags)


def _tag_places(
    body: str, lines: list[str], line: int, col: int
) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
    """Each `{{`/`{%` of BODY paired with the same one where the plan writes the scalar (from LINE:COL): a
    quoted or folded scalar, or a block with an indentation indicator, does not keep the body's lines and columns."""
    found = [(n, m.start() + 1) for n, text in enumerate(body.split("\n"), 1) for m in re.finditer(r"\{[{%]", text)]
    written = list(  # only as many as the body has: the rest of the plan is not read
        itertools.islice(
            (
                (n, m.start() + 1)
                for n in range(max(line, 1), len(lines) + 1)
                for m in re.finditer(r"\{[{%]", lines[n - 1])
                if n > line or m.start() + 1 >= col
            ),
            len(found),
        )
    )
    return tuple(zip(found, written[: len(found)], strict=True)) if len(written) >= len(found) else ()


def _render_one(job: ExpandedJob, name: str, renderer: Renderer, place: _Place) -> tuple[str | None, list[Diagnostic]]:
    """JOB's body from template NAME, or the located reasons it has none."""
    who = f"job {job.name}"
    try:
        template = renderer.template(name)
    except (ContextError, jinja2.TemplateError, RecursionError, LimitExceeded) as exc:
        return None, _unreadable(exc, place, who)
    try:
        body = renderer.render(name, template, job.context, f"{who}'s body")
    except (
        jinja2.TemplateError,
        ValueRefused,
        LimitExceeded,
        SecurityError,
        RecursionError,
        ArithmeticError,
        LookupError,
        TypeError,
        ValueError,
        AttributeError,
    ) as exc:
        return None, _render_failed(exc, name, renderer, place, who)
    body, problem = finish_heredocs(body)
    if problem is not None:
        line, col, message = problem
        return None, [error(*place.at(line, col), "R006", f"{who}: {message}")]
    return body, []


def _unreadable(exc: BaseException, place: _Place, who: str) -> list[Diagnostic]:
    """Why template NAME cannot be read at all (before any job's values)."""
    if isinstance(exc, ContextError):
        return [error(*place.at(line, col), "R005", msg) for line, col, msg in exc.problems]
    if isinstance(exc, jinja2.TemplateNotFound):
        return [error(*place.at(1, 1), "R001", f"template {exc.name!r} not found")]
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return [error(*place.at(exc.lineno or 1, 1), "R003", f"template syntax error: {exc.message}")]
    if isinstance(exc, RecursionError):
        return [error(*place.at(1, 1), "R003", "template nested too deeply to read")]
    if isinstance(exc, LimitExceeded):
        return [error(*place.at(1, 1), "R007", f"{who}: {exc}")]
    raise exc


def _render_failed(exc: BaseException, name: str, renderer: Renderer, place: _Place, who: str) -> list[Diagnostic]:
    """Why rendering JOB's body failed, at the template line where it did."""
    if isinstance(exc, ContextError):  # an included template's own quoting problem: located in that template
        path = renderer.template_path(exc.name) if exc.name else None
        where = _Place(display_path(path), 1, 0) if path is not None else place
        return [error(*where.at(line, col), "R005", f"{who}: {msg}") for line, col, msg in exc.problems]
    if isinstance(exc, ValueRefused):
        return [error(*place.at(exc.line, exc.col), "R006", f"{who}: {exc}")]
    at = place.at(_template_line(exc, name, renderer), 1)
    if isinstance(exc, jinja2.TemplateNotFound):
        return [error(*at, "R001", f"{who}: template {exc.name!r} not found")]
    if isinstance(exc, jinja2.UndefinedError):
        line = _template_line(exc, name, renderer)
        col = _name_col(renderer, name, line, exc.message)
        return [error(*place.at(line, col), "R002", f"{who}: undefined variable: {exc.message}")]
    if isinstance(exc, LimitExceeded):
        return [error(*at, "R007", f"{who}: {exc}")]
    if isinstance(exc, SecurityError):
        return [error(*at, "R008", f"{who}: not allowed in a plan's template: {exc}")]
    if isinstance(exc, RecursionError):
        return [error(*at, "R003", f"{who}: recursion too deep (a macro that calls itself?)")]
    if isinstance(exc, jinja2.TemplateError):
        return [error(*at, "R003", f"{who}: {exc}")]
    # A template's own mistake, such as `length` of a number: located, never a traceback.
    return [error(*at, "R003", f"{who}: {type(exc).__name__}: {exc}")]


def _name_col(renderer: Renderer, name: str, line: int, message: str | None) -> int:
    """The column of the undefined name MESSAGE speaks of on LINE of template NAME (1 if not found)."""
    match = re.match(r"'([^']+)' is undefined", message or "")
    if not match:
        return 1
    try:
        text = renderer.loader.get_source(renderer.env, name)[0].split("\n")[line - 1]
    except (jinja2.TemplateError, IndexError):
        return 1
    for expr in re.finditer(r"\{[{%].*?[}%]\}", text):
        found = re.search(rf"(?<![\w.]){re.escape(match.group(1))}\b", expr.group(0))
        if found:
            return expr.start() + found.start() + 1
    return 1


def _unused_with(job: ExpandedJob, renderer: Renderer, name: str, source: Source) -> list[Diagnostic]:
    """A `with:` key the template never reads is most likely a typo of one it does."""
    if not job.job.with_:
        return []
    used = renderer.names_used(name)
    if used is None:
        return []
    found = []
    for key in job.job.with_:
        if key not in used and key not in RESERVED:
            line, col = source.key(("jobs", job.index, "with", key))
            hint = [u for u in used if u not in job.context]
            close = difflib.get_close_matches(key, hint, n=1)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            found.append(
                warning(
                    source.path,
                    line,
                    col,
                    "R009",
                    f"with: {key!r} is not used by {job.job.template or 'the run: body'}{suggestion}",
                )
            )
    return found


def _with_header(job: ExpandedJob, body: str, graph: Graph, plan_name: str, comment: str) -> tuple[str, int]:
    spec = job.job
    done_if = condition(job.done_if if job.done_if is not None else job.outputs, graph)
    fields: dict[str, Any] = {
        "lane": spec.lane,
        # The blank line ends the header: a body that starts with a comment such as `# {{ note }}`
        # can never be read as a header key, whatever the value.
        "body": "\n" + body,
        "requires": condition(job.requires, graph),
        "done_if": done_if,
        "retries": spec.retries if spec.retries != 1 else None,
        "priority": spec.priority,
        "timeout": spec.timeout,
        "warn_after": spec.warn_after,
        "gpus": spec.gpus,
        "expect_wait": spec.expect_wait if isinstance(spec.expect_wait, str) else None,
        "outputs": [o.value for o in job.outputs],
        "comment": comment,
    }
    text = jobfile.format(
        **fields, sign=lambda unsigned: f"{plan_name}@{hashlib.sha256(unsigned.encode()).hexdigest()[:10]}"
    )
    header = text.index("\n\n") + 2  # the header's lines and the blank line: the body starts after them
    return text, text[:header].count("\n")


def _template_line(exc: BaseException, name: str, renderer: Renderer) -> int:
    """The line in template NAME where jinja2 raised (jinja2 rewrites tracebacks to template lines)."""
    wanted = {name}
    path = renderer.template_path(name)
    if path is not None:
        wanted.add(str(path))
        wanted.add(os.path.realpath(path))
    line = 1
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in wanted and frame.lineno:
            line = frame.lineno
    return line
