"""Stage 2, expand: resolve vars (and --set), multiply jobs by `foreach`, render names and fields."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2 import meta

from plancompiler.diagnostics import Diagnostic, error
from plancompiler.load import Source
from plancompiler.models import Job, Output, Plan, Requirement
from runner.jobfile import NAME_RE

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


@dataclass(frozen=True)
class ExpandedJob:
    """One concrete job: every field rendered, with where in the plan it came from."""

    name: str
    index: int
    line: int
    job: Job
    context: dict[str, Any]
    requires: tuple[Requirement, ...]
    outputs: tuple[Output, ...]
    done_if: tuple[Requirement, ...] | None
    row: dict[str, Any] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"{self.name}.job"


@dataclass
class Expanded:
    vars: dict[str, Any]
    jobs: list[ExpandedJob]
    diagnostics: list[Diagnostic]
    external: list[str] = field(default_factory=list)


class _RenderError(Exception):
    pass


def _names_in(value: Any) -> set[str]:
    if isinstance(value, str):
        if "{" not in value:
            return set()
        try:
            return set(meta.find_undeclared_variables(_ENV.parse(value)))
        except jinja2.TemplateSyntaxError as exc:
            raise _RenderError(f"template syntax error: {exc.message}") from exc
    if isinstance(value, Mapping):
        return set().union(*(_names_in(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_names_in(v) for v in value)) if value else set()
    return set()


_COMPILED: dict[str, jinja2.Template] = {}


def _template(source: str) -> jinja2.Template:
    """Each distinct field text is compiled once: foreach rows render the same text many times."""
    template = _COMPILED.get(source)
    if template is None:
        if len(_COMPILED) > 20000:
            _COMPILED.clear()
        template = _COMPILED[source] = _ENV.from_string(source)
    return template


def render_value(value: Any, context: Mapping[str, Any]) -> Any:
    """VALUE with every string rendered as a jinja2 template over CONTEXT (undefined names are errors)."""
    if isinstance(value, str):
        if "{" not in value:
            return value
        try:
            return _template(value).render(context)
        except jinja2.UndefinedError as exc:
            raise _RenderError(f"undefined variable: {exc.message}") from exc
        except jinja2.TemplateSyntaxError as exc:
            raise _RenderError(f"template syntax error: {exc.message}") from exc
        except jinja2.TemplateError as exc:
            raise _RenderError(str(exc)) from exc
    if isinstance(value, Mapping):
        return {k: render_value(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [render_value(v, context) for v in value]
    return value


def resolve_vars(raw: Mapping[str, Any], source: Source) -> tuple[dict[str, Any], list[Diagnostic]]:
    """Vars in dependency order; a cycle or an undefined name is a located error."""
    diagnostics: list[Diagnostic] = []
    deps: dict[str, set[str]] = {}
    for name, value in raw.items():
        try:
            deps[name] = _names_in(value) & set(raw)
        except _RenderError as exc:
            line, col = source.where(("vars", name))
            diagnostics.append(error(source.path, line, col, "P011", f"var {name!r}: {exc}"))
            deps[name] = set()
    resolved: dict[str, Any] = {}
    visiting: list[str] = []
    broken: set[str] = set()

    def visit(name: str) -> None:
        if name in resolved or name in broken:
            return
        if name in visiting:
            cycle = visiting[visiting.index(name):] + [name]
            line, col = source.key(("vars", name))
            diagnostics.append(error(source.path, line, col, "P010", f"vars refer to each other in a cycle: "
                                     f"{' -> '.join(cycle)}"))
            broken.update(cycle)
            return
        visiting.append(name)
        for dep in sorted(deps[name]):
            visit(dep)
        visiting.pop()
        if name in broken or deps[name] & broken:
            broken.add(name)
            return
        try:
            resolved[name] = render_value(raw[name], resolved)
        except _RenderError as exc:
            line, col = source.where(("vars", name))
            diagnostics.append(error(source.path, line, col, "P011", f"var {name!r}: {exc}"))
            broken.add(name)

    for name in raw:
        visit(name)
    return resolved, diagnostics


def _rows(job: Job, index: int, variables: Mapping[str, Any], source: Source) -> list[dict[str, Any]]:
    spec = job.foreach
    if spec is None:
        return [{}]
    where = ("jobs", index, "foreach")
    if isinstance(spec, str):
        name = spec.strip().removeprefix("{{").removesuffix("}}").strip()
        if name not in variables:
            raise _LocatedError(where, f"foreach names var {name!r}, which is not defined")
        spec = variables[name]
        if not isinstance(spec, (list, dict)):
            raise _LocatedError(where, f"foreach var {name!r} must hold a list of rows or a mapping of lists")
    if isinstance(spec, dict):
        keys = list(spec)
        lists = []
        for key in keys:
            values = spec[key]
            if isinstance(values, str):
                values = variables.get(values.strip().removeprefix("{{").removesuffix("}}").strip(), values)
            if not isinstance(values, list):
                raise _LocatedError((*where, key), f"foreach.{key} must be a list")
            lists.append(values)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*lists)]
    rows = []
    for i, row in enumerate(spec):
        if not isinstance(row, dict):
            raise _LocatedError((*where, i), "each foreach row must be a mapping")
        rows.append(row)
    return rows


class _LocatedError(Exception):
    def __init__(self, loc: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def expand(plan: Plan, source: Source, overrides: Mapping[str, str] | None = None) -> Expanded:
    raw = dict(plan.vars)
    raw.update(overrides or {})
    variables, diagnostics = resolve_vars(raw, source)
    variables.setdefault("plan_name", plan.plan)
    external = []
    for i, path in enumerate(plan.external):
        try:
            external.append(render_value(path, variables))
        except _RenderError as exc:
            pos = source.where(("external", i))
            diagnostics.append(error(source.path, pos[0], pos[1], "P011", f"external[{i}]: {exc}"))
    jobs: list[ExpandedJob] = []
    seen: dict[str, int] = {}
    for index, job in enumerate(plan.jobs):
        line = source.job_line(index)
        try:
            rows = _rows(job, index, variables, source)
        except _LocatedError as exc:
            pos = source.where(exc.loc)
            diagnostics.append(error(source.path, pos[0], pos[1], "P012", str(exc)))
            continue
        for row in rows:
            try:
                item = _expand_one(plan, job, index, line, row, variables, source)
            except _LocatedError as exc:
                pos = source.where(exc.loc)
                diagnostics.append(error(source.path, pos[0], pos[1], "P011", str(exc)))
                continue
            name_pos = source.where(("jobs", index, "name"))
            if item.name in seen:
                diagnostics.append(error(source.path, name_pos[0], name_pos[1], "P020",
                                         f"duplicate job name {item.name!r} (also made by the job on line "
                                         f"{seen[item.name]})"))
                continue
            if not NAME_RE.match(item.name) or ".." in item.name:
                diagnostics.append(error(source.path, name_pos[0], name_pos[1], "P021",
                                         f"job name {item.name!r}: use letters, digits, '.', '_' and '-', "
                                         "starting with a letter or digit"))
                continue
            if item.job.lane not in plan.lanes:
                lane_pos = source.where(("jobs", index, "lane"))
                diagnostics.append(error(source.path, lane_pos[0], lane_pos[1], "P022",
                                         f"lane {item.job.lane!r} is not one of the plan's lanes: "
                                         f"{', '.join(plan.lanes)}"))
            seen[item.name] = line
            jobs.append(item)
    return Expanded(variables, jobs, diagnostics, external)


def _expand_one(plan: Plan, job: Job, index: int, line: int, row: dict[str, Any],
                variables: Mapping[str, Any], source: Source) -> ExpandedJob:
    def render(value: Any, loc: tuple[Any, ...], context: Mapping[str, Any]) -> Any:
        try:
            return render_value(value, context)
        except _RenderError as exc:
            raise _LocatedError(("jobs", index, *loc), f"{'.'.join(map(str, loc))}: {exc}") from exc

    base = {**variables}
    row = {k: render(v, ("foreach",), base) for k, v in row.items()}
    context = {**base, **row}
    with_values = {k: render(v, ("with", k), context) for k, v in job.with_.items()}
    context.update(with_values)
    name = render(job.name, ("name",), context)
    requires = tuple(r.model_copy(update={"value": render(r.value, ("requires", i), context)})
                     for i, r in enumerate(job.requires))
    outputs = tuple(o.model_copy(update={"value": render(o.value, ("outputs", i), context)})
                    for i, o in enumerate(job.outputs))
    done_if: tuple[Requirement, ...] | None = None
    if job.done_if is not None:
        items = job.done_if if isinstance(job.done_if, list) else [job.done_if]
        done_if = tuple(r.model_copy(update={"value": render(r.value, ("done_if",), context)}) for r in items)
    context.update({"name": name, "lane": job.lane, "job_outputs": [o.value for o in outputs]})
    return ExpandedJob(name, index, line, job, context, requires, outputs, done_if, row)
