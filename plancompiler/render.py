"""Stage 4, render: jinja2 bodies with every value shell-quoted, headers by runner.jobfile.format."""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from plancompiler.diagnostics import Diagnostic, error, warning
from plancompiler.expand import ExpandedJob
from plancompiler.graph import Graph
from plancompiler.load import Source
from plancompiler.models import Requirement
from runner import jobfile

_INLINE = "inline:"


class Shell(str):
    """A value the template marks as shell code on purpose (`{{ x | sh }}`): written unquoted."""


def shell_quote(value: Any) -> str:
    """What `{{ value }}` writes into a job: one quoted word, or quoted words for a list."""
    if isinstance(value, Shell):
        return str(value)
    if isinstance(value, jinja2.Undefined):
        return str(value)  # StrictUndefined raises here, at the template's line
    if isinstance(value, (list, tuple)):
        return " ".join(shlex.quote(str(v)) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return shlex.quote(str(value))


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
    """One jinja2 environment per compile: each template is compiled once, rendered per job."""

    def __init__(self, template_dirs: Sequence[Path], jobs: Sequence[ExpandedJob]) -> None:
        self.template_dirs = [Path(d) for d in template_dirs]
        self.inline = {f"{_INLINE}{j.index}": j.job.run or "" for j in jobs if j.job.run is not None}
        loader = jinja2.ChoiceLoader([
            jinja2.FunctionLoader(self._inline_source),
            jinja2.FileSystemLoader([str(d) for d in self.template_dirs]),
        ])
        self.env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, finalize=shell_quote,
                                      keep_trailing_newline=True, autoescape=False, auto_reload=False,
                                      cache_size=-1)
        self.env.filters["sh"] = lambda value: Shell(" ".join(map(str, value)) if isinstance(value, list)
                                                     else str(value))
        self.env.filters["q"] = shell_quote

    def _inline_source(self, name: str) -> tuple[str, str, Any] | None:
        if name in self.inline:
            return self.inline[name], name, lambda: True
        return None

    def template_path(self, name: str) -> Path | None:
        for directory in self.template_dirs:
            if (directory / name).is_file():
                return directory / name
        return None


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def condition(requirements: Sequence[Requirement], graph: Graph) -> str | None:
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


def render_jobs(jobs: Sequence[ExpandedJob], graph: Graph, source: Source, plan_name: str,
                template_dirs: Sequence[Path]) -> tuple[list[RenderedJob], list[Diagnostic]]:
    renderer = Renderer(template_dirs, jobs)
    rendered: list[RenderedJob] = []
    diagnostics: list[Diagnostic] = []
    flagged: set[str] = set()
    comment = f"generated from {Path(source.path).name} by plan; do not edit"
    for job in jobs:
        name = job.job.template or f"{_INLINE}{job.index}"
        if job.job.template:
            path = renderer.template_path(job.job.template)
            if path is None:
                line, col = source.where(("jobs", job.index, "template"))
                dirs = ", ".join(_display(d) for d in renderer.template_dirs) or "(none)"
                diagnostics.append(error(source.path, line, col, "R001",
                                         f"template {job.job.template!r} not found in {dirs}"))
                continue
            origin, origin_line, template_source = _display(path), 1, path.read_text()
        else:
            origin, origin_line = source.path, source.where(("jobs", job.index, "run"))[0]
            template_source = job.job.run or ""
        if name not in flagged:
            flagged.add(name)
            diagnostics.extend(_quoted_expressions(template_source, origin, origin_line))
        try:
            template = renderer.env.get_template(name)
            body = template.render(job.context)
        except jinja2.TemplateSyntaxError as exc:
            diagnostics.append(error(origin, origin_line + (exc.lineno or 1) - 1, 1, "R003",
                                     f"template syntax error: {exc.message}"))
            continue
        except jinja2.UndefinedError as exc:
            line = _template_line(exc, name, renderer)
            diagnostics.append(error(origin, origin_line + line - 1, 1, "R002",
                                     f"job {job.name}: undefined variable: {exc.message}"))
            continue
        except jinja2.TemplateError as exc:
            line = _template_line(exc, name, renderer)
            diagnostics.append(error(origin, origin_line + line - 1, 1, "R003", f"job {job.name}: {exc}"))
            continue
        text, header = _with_header(job, body, graph, plan_name, comment)
        matches = body.count("\n") == template_source.count("\n")
        rendered.append(RenderedJob(job, text, header, origin, origin_line, matches))
    return rendered, diagnostics


def _with_header(job: ExpandedJob, body: str, graph: Graph, plan_name: str, comment: str) -> tuple[str, int]:
    spec = job.job
    done_if = condition(job.done_if, graph) if job.done_if is not None else condition(
        [Requirement(kind=o.kind, value=o.value) for o in job.outputs], graph)
    fields: dict[str, Any] = {
        "lane": spec.lane,
        "body": body,
        "requires": condition(job.requires, graph),
        "done_if": done_if,
        "retries": spec.retries if spec.retries != 1 else None,
        "timeout": spec.timeout,
        "warn_after": spec.warn_after,
        "outputs": [o.value for o in job.outputs],
        "comment": comment,
    }
    unsigned = jobfile.format(**fields)
    digest = hashlib.sha256(unsigned.encode()).hexdigest()[:10]
    text = jobfile.format(**fields, plan=f"{plan_name}@{digest}")
    header = text[: text.index(body)].count("\n") if body and body in text else text.count("\n")
    return text, header


def _template_line(exc: BaseException, name: str, renderer: Renderer) -> int:
    """The line in template NAME where jinja2 raised (jinja2 rewrites tracebacks to template lines)."""
    wanted = {name}
    path = renderer.template_path(name)
    if path is not None:
        wanted.add(str(path))
        wanted.add(str(path.resolve()))
    line = 1
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in wanted and frame.lineno:
            line = frame.lineno
    return line


_EXPR = re.compile(r"\{\{(.*?)\}\}")


def _quoted_expressions(text: str, origin: str, first_line: int) -> list[Diagnostic]:
    """`"...{{ x }}..."`: the value is already quoted, so the double quotes put its quotes in the data."""
    found = []
    for offset, line in enumerate(text.split("\n")):
        i = 0
        in_single = in_double = False
        if line.lstrip().startswith("#"):
            continue
        while i < len(line):
            ch = line[i]
            if line.startswith("{{", i):
                end = line.find("}}", i)
                expr = line[i + 2:end] if end != -1 else line[i + 2:]
                if in_double and not re.search(r"\|\s*sh\b", expr):
                    found.append(warning(origin, first_line + offset, i + 1, "R004",
                                         f"{{{{{expr}}}}} inside double quotes: the value is already shell-quoted; "
                                         "drop the quotes, or use `| sh` if it is shell code on purpose"))
                i = end + 2 if end != -1 else len(line)
                continue
            if ch == "\\" and not in_single:
                i += 2
                continue
            if ch == "'" and not in_double:
                in_single = not in_single
            elif ch == '"' and not in_single:
                in_double = not in_double
            i += 1
    return found
