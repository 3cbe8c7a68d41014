"""`plan check`, `render`, `graph` and `schema`: a plan compiled, its findings printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from plancompiler.cli.shared import (
    GLOBAL,
    Format,
    GraphFormat,
    PlanArg,
    PlansArg,
    SetOpt,
    TemplatesOpt,
    app,
    compile_one,
    fail,
    print_findings,
)
from plancompiler.errors import PlanError, PlanFileError


@app.command()
def check(
    plans: PlansArg,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format", help="text (path:line:col: severity[code]: message), json, or github (workflow annotations)"
        ),
    ] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the check too")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="re-run shellcheck on every job")] = False,
) -> None:
    """Load, expand, graph-check, render and lint each PLAN; print every finding of every job.

    Exit 0 when clean, 1 when there are errors (or warnings with --strict), 2 on usage or I/O errors.
    """
    compiled, unreadable = [], []
    for path in plans:
        try:
            compiled.append(_checked(path, set_, templates, no_cache))
        except PlanFileError as exc:  # the other plans are checked all the same; this one is reported last
            unreadable.append(exc)
    if fmt is not Format.text and unreadable:
        # A machine reads only the findings: each unreadable plan is one there too (P000), still exit 2.
        from plancompiler.diagnostics import error

        print_findings(compiled, fmt, strict, [error(e.where or "", 1, 1, "P000", e.message) for e in unreadable])
        raise typer.Exit(2)
    code = print_findings(compiled, fmt, strict) if compiled else 2  # no summary of no plan before its error
    if unreadable:
        raise unreadable[0] if len(unreadable) == 1 else PlanError("\n".join(str(e) for e in unreadable))
    raise typer.Exit(code)


def _checked(path: Path, sets: list[str] | None, templates: list[Path] | None, no_cache: bool):
    """PATH's check, remembered or compiled (plancompiler/memo/checkmemo.py)."""
    from plancompiler.memo import checkmemo

    def compile_() -> checkmemo.Checked:
        return compile_one(path, sets, templates, no_cache)

    return checkmemo.checked(path, sets or [], templates or [], GLOBAL["max_size"], not no_cache, compile_)


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
    from plancompiler.commands.write import write_jobs

    compiled = compile_one(plan, set_, templates, no_cache)
    code = print_findings([compiled], Format.text, strict)
    if code:
        typer.echo(f"plan: nothing written to {out}", err=True)
        raise typer.Exit(code)
    try:
        write_jobs(compiled.jobs, out)
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc}") from exc
    typer.echo(f"wrote {len(compiled.jobs)} job{'s' * (len(compiled.jobs) != 1)} to {out}", err=True)


@app.command()
def graph(
    plan: PlanArg,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="dot (Graphviz) or mermaid")] = GraphFormat.dot,
    set_: SetOpt = None,
) -> None:
    """Print PLAN's job graph: an edge from each producer to each job that requires its outputs.

    A plan with errors (a cycle, a job that could not be expanded or rendered) still prints the graph as far as
    it was built, with the errors on stderr and exit 1: a job left out of it is said, never dropped silently."""
    from plancompiler.diagnostics import format_all, has_errors, summary
    from plancompiler.graph import to_dot, to_mermaid

    compiled = compile_one(plan, set_, None, lint=False)
    if compiled.graph is None:
        raise typer.Exit(print_findings([compiled], Format.text, False))
    graph_ = compiled.graph
    typer.echo(to_dot(graph_, compiled.name) if fmt is GraphFormat.dot else to_mermaid(graph_), nl=False)
    if has_errors(compiled.diagnostics):
        typer.echo(format_all(compiled.diagnostics, Format.text.value), err=True)
        typer.echo(summary(compiled.diagnostics, compiled.job_count), err=True)
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the YAML plan format, for editors (yaml-language-server)."""
    from plancompiler.models import Plan

    typer.echo(json.dumps(Plan.model_json_schema(by_alias=True), indent=1))
