"""Stage 2, expand: resolve vars (and --set), multiply jobs by `foreach`, render names and fields."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import SecurityError

from plancompiler.diagnostics import Diagnostic, error, warning
from plancompiler.foreach import MAX_JOBS, RESERVED, LocatedError, text_order_breaks_count
from plancompiler.foreach import rows as rows_of
from plancompiler.load import Source
from plancompiler.models import Job, Output, Plan, Requirement
from plancompiler.plainvalue import render_plain
from plancompiler.sandbox import BoundedSandbox, LimitExceeded, Limits
from plancompiler.shell import ContextError, ValueRefused, finish_heredocs, shell_environment
from runner.jobfile import NAME_RE

_ENVS: dict[Limits, BoundedSandbox] = {}
_LIMITS = Limits()


def _env(limits: Limits) -> BoundedSandbox:
    """The sandbox YAML values render in, one per set of limits; it keeps each field's compiled form."""
    env = _ENVS.get(limits)
    if env is None:
        env = _ENVS[limits] = BoundedSandbox(limits)
    return env


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

    @cached_property
    def filename(self) -> str:  # asked for many times a job by the push's diff and record
        return f"{self.name}.job"


@dataclass
class Expanded:
    vars: dict[str, Any]
    jobs: list[ExpandedJob]
    diagnostics: list[Diagnostic]
    external: list[str] = field(default_factory=list)
    attempted: int = 0  # every job the plan describes, also those that failed to expand


class _RenderError(Exception):
    pass


def _names_in(value: Any, limits: Limits) -> set[str]:
    if isinstance(value, str):
        if "{" not in value:
            return set()
        try:
            # Parsed in the sandbox: a plain environment would fold `'a' * 10**10` while reading it.
            return set(meta.find_undeclared_variables(_env(limits).parse(value)))
        except jinja2.TemplateSyntaxError as exc:
            raise _RenderError(f"template syntax error: {exc.message}") from exc
        except RecursionError as exc:
            raise _RenderError("template nested too deeply to read") from exc
        except (jinja2.TemplateError, LimitExceeded) as exc:
            raise _RenderError(str(exc)) from exc
    if isinstance(value, Mapping):
        return set().union(*(_names_in(v, limits) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_names_in(v, limits) for v in value)) if value else set()
    return set()


def _template(source: str, env: BoundedSandbox) -> jinja2.Template:
    """Each distinct field text is compiled once: foreach rows render the same text many times."""
    compiled = env.compiled
    template = compiled.get(source)
    if template is None:
        if len(compiled) > 20000:
            compiled.clear()
        template = compiled[source] = env.from_string(source)
    return template


def _failure(exc: Exception) -> _RenderError:
    """What went wrong rendering a value, in the words of a finding; a bug of ours is raised as it is."""
    if isinstance(exc, _RenderError):
        return exc
    if isinstance(exc, jinja2.UndefinedError):
        return _RenderError(f"undefined variable: {exc.message}")
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return _RenderError(f"template syntax error: {exc.message}")
    if isinstance(exc, SecurityError):
        return _RenderError(f"not allowed in a plan: {exc}")
    if isinstance(exc, (jinja2.TemplateError, LimitExceeded, ValueRefused)):
        return _RenderError(str(exc))
    if isinstance(exc, RecursionError):
        return _RenderError("recursion too deep")
    if isinstance(exc, (ArithmeticError, LookupError, TypeError, ValueError, AttributeError)):
        return _RenderError(f"{type(exc).__name__}: {exc}")
    raise exc


def render_value(value: Any, context: Any, limits: Limits | None = None) -> Any:
    """VALUE with every string rendered in the sandbox over CONTEXT (undefined names are errors)."""
    if isinstance(value, str):
        if "{" not in value:
            return value
        plain = render_plain(value, context, (limits or _LIMITS).max_size)
        if plain is not None:
            return plain
        env = _env(limits or _LIMITS)
        try:
            return env.render_bounded(_template(value, env), context, "the value")
        except Exception as exc:  # each kind of failure is told apart by _failure
            raise _failure(exc) from exc
    if isinstance(value, Mapping):
        return {k: render_value(v, context, limits) for k, v in value.items()}
    if isinstance(value, list):
        return [render_value(v, context, limits) for v in value]
    return value


def resolve_vars(
    raw: Mapping[str, Any], source: Source, limits: Limits | None = None, from_set: Collection[str] = ()
) -> tuple[dict[str, Any], list[Diagnostic]]:
    """Vars in dependency order; a cycle or an undefined name is a located error.

    FROM_SET names the vars whose value came from `--set`: their findings say so, since the
    value at the plan's line is not the one that failed.
    """
    diagnostics: list[Diagnostic] = []
    deps: dict[str, set[str]] = {}

    def var(name: str) -> str:
        return f"var {name!r} (--set {name}={_short(str(raw[name]))[1:-1]})" if name in from_set else f"var {name!r}"

    names = set(raw)  # once: built per var, it made 50,000 vars take minutes (n squared)
    for name, value in raw.items():
        try:
            deps[name] = _names_in(value, limits or Limits()) & names
        except _RenderError as exc:
            line, col = source.where(("vars", name))
            diagnostics.append(error(source.path, line, col, "P011", f"{var(name)}: {exc}"))
            deps[name] = set()
    resolved: dict[str, Any] = {}
    visiting: list[str] = []
    on_path: set[str] = set()  # visiting's names, looked up in constant time
    broken: set[str] = set()

    def visit(name: str) -> None:
        if name in resolved or name in broken:
            return
        if name in on_path:
            cycle = visiting[visiting.index(name) :] + [name]
            line, col = source.key(("vars", name))
            given = sorted(set(cycle) & set(from_set))
            by_set = f" (made by --set {', '.join(given)})" if given else ""
            diagnostics.append(
                error(
                    source.path, line, col, "P010", f"vars refer to each other in a cycle: {' -> '.join(cycle)}{by_set}"
                )
            )
            broken.update(cycle)
            return
        visiting.append(name)
        on_path.add(name)
        for dep in sorted(deps[name]):
            visit(dep)
        on_path.discard(visiting.pop())
        if name in broken or deps[name] & broken:
            broken.add(name)
            return
        try:
            resolved[name] = render_value(raw[name], resolved, limits)
        except _RenderError as exc:
            line, col = source.where(("vars", name))
            diagnostics.append(error(source.path, line, col, "P011", f"{var(name)}: {exc}"))
            broken.add(name)

    for name in raw:
        visit(name)
    return resolved, diagnostics


def expand(
    plan: Plan, source: Source, overrides: Mapping[str, str] | None = None, limits: Limits | None = None
) -> Expanded:
    limits = limits or Limits()
    raw = dict(plan.vars)
    raw.update(overrides or {})
    variables, diagnostics = resolve_vars(raw, source, limits, set(overrides or ()))
    for key in overrides or ():
        if key not in plan.vars:  # most likely a typo, which would otherwise change nothing, silently
            hint = difflib.get_close_matches(key, list(plan.vars), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            diagnostics.append(warning(source.path, 1, 1, "P013", f"--set {key}: no such var in this plan{suggestion}"))
    variables.setdefault("plan_name", plan.plan)
    external = _externals(plan, source, variables, limits, diagnostics)
    jobs: list[ExpandedJob] = []
    seen: dict[str, int] = {}
    attempted = 0
    for index, job in enumerate(plan.jobs):
        diagnostics += _reserved_with(job, index, source)
        try:
            rows = rows_of(job, index, variables)
        except LocatedError as exc:
            attempted += 1
            pos = source.where(exc.loc)
            diagnostics.append(error(source.path, pos[0], pos[1], "P012", str(exc)))
            continue
        if attempted + len(rows) > MAX_JOBS:
            pos = source.where(("jobs", index))
            diagnostics.append(
                error(source.path, pos[0], pos[1], "P012", f"the plan makes more than {MAX_JOBS:,} jobs")
            )
            break
        attempted += len(rows)
        line = source.job_line(index)
        first = len(jobs)
        for row in rows:
            try:
                item = _expand_one(plan, job, index, line, row, variables, limits)
            except LocatedError as exc:
                pos = source.where(exc.loc)
                diagnostics.append(error(source.path, pos[0], pos[1], "P011", str(exc)))
                continue
            refused = _refused(item, plan, source, seen)
            if refused is not None:
                diagnostics.append(refused)
                continue
            jobs.append(item)
        broken = text_order_breaks_count([item.name for item in jobs[first:]])
        if broken is not None:
            pos = source.where(("jobs", index, "name"))
            earlier, later = broken
            diagnostics.append(
                warning(
                    source.path,
                    pos[0],
                    pos[1],
                    "P014",
                    f"{later!r} starts before {earlier!r}: a lane runs its jobs in name order, which is text order; "
                    "pad the number to one width (e.g. {{ '%04d' | format(i) }}) for the rows' order",
                )
            )
    if any(d.code == "P023" for d in diagnostics):
        jobs = [j for j in jobs if not set(j.job.with_) & set(RESERVED)]
    return Expanded(variables, jobs, diagnostics, external, attempted)


def _externals(
    plan: Plan, source: Source, variables: dict[str, Any], limits: Limits, diagnostics: list[Diagnostic]
) -> list[str]:
    external = []
    for i, path in enumerate(plan.external):
        try:
            external.append(_path(render_value(path, variables, limits)))
        except (_RenderError, LocatedError) as exc:
            pos = source.where(("external", i))
            diagnostics.append(error(source.path, pos[0], pos[1], "P011", f"external[{i}]: {exc}"))
    return external


def _reserved_with(job: Job, index: int, source: Source) -> list[Diagnostic]:
    """A `with:` key that would replace a name every template gets from the compiler."""
    found = []
    for key in job.with_:
        if key in RESERVED:
            pos = source.key(("jobs", index, "with", key))
            found.append(
                error(
                    source.path,
                    pos[0],
                    pos[1],
                    "P023",
                    f"with: {key!r} would replace the built-in {key!r} (the job's own "
                    f"{key.replace('_', ' ')}); rename it",
                )
            )
    return found


def _refused(item: ExpandedJob, plan: Plan, source: Source, seen: dict[str, int]) -> Diagnostic | None:
    """Why ITEM is not a job of the plan (a duplicate or unusable name, an unknown lane); None: it is, and
    its name is now SEEN."""
    name_pos = source.where(("jobs", item.index, "name"))
    if item.name in seen:
        return error(
            source.path,
            name_pos[0],
            name_pos[1],
            "P020",
            f"duplicate job name {item.name!r} (also made by the job on line {seen[item.name]})",
        )
    if not NAME_RE.fullmatch(item.name) or ".." in item.name or len(item.name) > 200:
        return error(
            source.path,
            name_pos[0],
            name_pos[1],
            "P021",
            f"job name {_short(item.name)}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 200 characters",
        )
    seen[item.name] = item.line
    if item.job.lane not in plan.lanes:
        lane_pos = source.where(("jobs", item.index, "lane"))
        return error(
            source.path,
            lane_pos[0],
            lane_pos[1],
            "P022",
            f"lane {item.job.lane!r} is not one of the plan's lanes: {', '.join(plan.lanes)}",
        )  # never rendered: a job file cannot carry that lane
    return None


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _path(value: Any, kind: str = "path") -> str:
    """A rendered path (or `sh:` command) as it will go into a header: one non-empty line."""
    noun = "command" if kind == "sh" else "path"
    if not isinstance(value, str):
        raise _RenderError(f"a {noun} must be a string, not {type(value).__name__}")
    for bad, what in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL byte")):
        if bad in value:
            raise _RenderError(f"the {noun} {_short(value)} holds {what}: a job header cannot carry it")
    if not value.strip():
        raise _RenderError(f"the {noun} is empty")
    return value


_SHELL_ENVS: dict[Limits, BoundedSandbox] = {}


def render_shell(text: str, context: Mapping[str, Any], limits: Limits) -> str:
    """A `sh:` requirement: shell code written in the plan, so its values are escaped as in a job body."""
    if "{" not in text:
        return text
    env = _SHELL_ENVS.get(limits)
    if env is None:
        env = _SHELL_ENVS[limits] = shell_environment(limits)
    try:
        body, problem = finish_heredocs(env.render_bounded(_template(text, env), context, "the command"))
    except ContextError as exc:
        raise _RenderError(exc.problems[0][2]) from exc
    except Exception as exc:  # told apart by _failure
        raise _failure(exc) from exc
    if problem is not None:
        raise _RenderError(problem[2])
    return body


def _expand_one(
    plan: Plan, job: Job, index: int, line: int, row: dict[str, Any], variables: Mapping[str, Any], limits: Limits
) -> ExpandedJob:
    def render(value: Any, loc: tuple[Any, ...], context: Mapping[str, Any]) -> Any:
        try:
            return render_value(value, context, limits)
        except _RenderError as exc:
            raise LocatedError(("jobs", index, *loc), f"{'.'.join(map(str, loc))}: {exc}") from exc

    def path(value: str, loc: tuple[Any, ...], context: Mapping[str, Any], kind: str = "path") -> str:
        try:
            if kind == "sh":
                return _path(render_shell(value, context, limits), kind)
            return _path(render(value, loc, context))
        except _RenderError as exc:
            raise LocatedError(("jobs", index, *loc), f"{'.'.join(map(str, loc))}: {exc}") from exc

    base = {**variables}
    row = {k: render(v, ("foreach",), base) for k, v in row.items()}
    context = {**base, **row}
    with_values = {k: render(v, ("with", k), context) for k, v in job.with_.items()}
    context.update(with_values)
    name = render(job.name, ("name",), context)
    if not isinstance(name, str):
        raise LocatedError(("jobs", index, "name"), "name: must be a string")
    requires = tuple(
        r.model_copy(update={"value": path(r.value, ("requires", i), context, r.kind)})
        for i, r in enumerate(job.requires)
    )
    outputs = tuple(
        o.model_copy(update={"value": path(o.value, ("outputs", i), context)}) for i, o in enumerate(job.outputs)
    )
    done_if: tuple[Requirement, ...] | None = None
    if job.done_if is not None:
        items = job.done_if if isinstance(job.done_if, list) else [job.done_if]
        done_if = tuple(r.model_copy(update={"value": path(r.value, ("done_if",), context, r.kind)}) for r in items)
    context.update({"name": name, "lane": job.lane, "plan": plan.plan, "job_outputs": [o.value for o in outputs]})
    return ExpandedJob(name, index, line, job, context, requires, outputs, done_if, row)
