"""The `plan` command: parses arguments, calls one stage function, prints, returns an exit code."""
from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from plancompiler import __version__
from plancompiler.diagnostics import PlanError, format_all, has_errors, summary

app = typer.Typer(
    name="plan",
    help="Compile typed job plans into checked bash job files, push them to a host's queue, "
    "and watch and report on the runner. Exit codes: 0 ok, 1 findings or refused, 2 usage or I/O, "
    "3 host unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
hooks_app = typer.Typer(help="Git hooks that run `plan check` before a push.", no_args_is_help=True)
app.add_typer(hooks_app, name="hooks")


class Format(str, Enum):
    text = "text"
    json = "json"
    github = "github"


class GraphFormat(str, Enum):
    dot = "dot"
    mermaid = "mermaid"


SetOpt = Annotated[Optional[list[str]], typer.Option(  # noqa: UP007 - typer needs Optional
    "--set", metavar="KEY=VALUE", help="override a plan var (repeatable), e.g. --set work=/tmp/demo")]
TemplatesOpt = Annotated[Optional[list[Path]], typer.Option(  # noqa: UP007
    "--templates", metavar="DIR", help="look for templates here first (repeatable); then templates/ beside the plan")]
PlansArg = Annotated[list[Path], typer.Argument(help="plan files: YAML (.yaml/.yml) or Python (.py)", metavar="PLAN...")]
PlanArg = Annotated[Path, typer.Argument(help="a plan file: YAML or Python", metavar="PLAN")]


def _overrides(values: list[str] | None) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes KEY=VALUE, not {item!r}")
        result[key.strip()] = value
    return result


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"plan: {message}", err=True)
    return typer.Exit(code)


def _compile(path: Path, sets: list[str] | None, templates: list[Path] | None, no_cache: bool = False,
             lint: bool = True):  # noqa: ANN202
    from plancompiler.compile import compile_plan

    try:
        return compile_plan(path, _overrides(sets), templates or [], lint=lint, use_cache=not no_cache)
    except PlanError as exc:
        raise _fail(str(exc)) from exc


def _report(compiled_list, fmt: Format, strict: bool) -> int:  # noqa: ANN001
    diagnostics = [d for c in compiled_list for d in c.diagnostics]
    text = format_all(diagnostics, fmt.value)
    if text:
        typer.echo(text)
    jobs = sum(len(c.jobs) for c in compiled_list)
    if fmt is Format.text:
        typer.echo(summary(diagnostics, jobs), err=True)
    if any(d.code == "P000" for d in diagnostics):
        return 2
    return 1 if has_errors(diagnostics, strict) else 0


@app.command()
def check(
    plans: PlansArg,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    fmt: Annotated[Format, typer.Option("--format", help="text (path:line:col: severity[code]: message), "
                                        "json, or github (workflow annotations)")] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the check too")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="re-run shellcheck on every job")] = False,
) -> None:
    """Load, expand, graph-check, render and lint each PLAN; print every finding of every job.

    Exit 0 when clean, 1 when there are errors (or warnings with --strict), 2 on usage or I/O errors.
    """
    compiled = [_compile(p, set_, templates, no_cache) for p in plans]
    raise typer.Exit(_report(compiled, fmt, strict))


@app.command()
def render(
    plan: PlanArg,
    out: Annotated[Path, typer.Option("-o", "--out", help="directory to write the job files to")],
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="warnings also stop the write")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="re-run shellcheck on every job")] = False,
) -> None:
    """Check PLAN, then write its job files to DIR; on any error DIR is left untouched.

    DIR is replaced as a whole: afterwards it holds exactly this plan's jobs.
    """
    from plancompiler.write import write_jobs

    compiled = _compile(plan, set_, templates, no_cache)
    code = _report([compiled], Format.text, strict)
    if code:
        typer.echo(f"plan: nothing written to {out}", err=True)
        raise typer.Exit(code)
    try:
        write_jobs(compiled.jobs, out)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from exc
    typer.echo(f"wrote {len(compiled.jobs)} jobs to {out}", err=True)


@app.command()
def graph(
    plan: PlanArg,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="dot (Graphviz) or mermaid")] = GraphFormat.dot,
    set_: SetOpt = None,
) -> None:
    """Print PLAN's job graph: an edge from each producer to each job that requires its outputs."""
    from plancompiler.graph import to_dot, to_mermaid

    compiled = _compile(plan, set_, None, lint=False)
    if compiled.graph is None:
        raise typer.Exit(_report([compiled], Format.text, False))
    graph_ = compiled.graph
    typer.echo(to_dot(graph_, compiled.name) if fmt is GraphFormat.dot else to_mermaid(graph_), nl=False)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the YAML plan format, for editors (yaml-language-server)."""
    from plancompiler.models import Plan

    typer.echo(json.dumps(Plan.model_json_schema(by_alias=True), indent=1))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"plan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """plan: typed job plans in, checked job files out, and the queue they run in."""


def main(argv: list[str] | None = None) -> int:
    try:
        app(args=argv, prog_name="plan")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
