"""What every `plan` command shares: the typer app, the common options, and the one handler at the command
line's edge (`edge`) that turns an error (plancompiler/errors.py) into `plan: MESSAGE` and its exit code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from plancompiler.diagnostics import Diagnostic, format_all, has_errors, summary
from plancompiler.errors import PlanFailure, Unreachable
from runner.readers import terminal_safe


def edge(command: Callable[..., Any]) -> Callable[..., Any]:
    """COMMAND with the one handler at the command line's edge: an error it raises (a PlanFailure) is printed as
    `plan: MESSAGE` and ends it with the error's exit code; an unreachable host says so first."""

    @functools.wraps(command)  # typer and cli/light read the declarations through __wrapped__
    def at_the_edge(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except PlanFailure as exc:
            raise fail(f"unreachable: {exc}" if isinstance(exc, Unreachable) else str(exc), exc.code) from exc

    return at_the_edge


app = typer.Typer(
    name="plan",
    help="Compile typed job plans into checked bash job files, push them to a host's queue, "
    "and watch and report on the runner. Exit codes: 0 ok, 1 findings or refused, 2 usage or I/O, "
    "3 host unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: paragraphs re-wrapped, [brackets] shown as written
)


hooks_app = typer.Typer(help="Git hooks that run `plan check` before a push.", no_args_is_help=True)


class Format(str, Enum):
    text = "text"
    json = "json"
    github = "github"


class GraphFormat(str, Enum):
    dot = "dot"
    mermaid = "mermaid"


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="override a plan var (repeatable), e.g. --set work=/tmp/demo"),
]


TemplatesOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--templates",
        metavar="DIR",
        help="look for templates here first (repeatable); then in templates/ "
        "beside the plan, templates/ in the plan's parent directory, and ./templates",
    ),
]


PlansArg = Annotated[list[Path], typer.Argument(help="plan files: YAML (.yaml/.yml) or Python (.py)", metavar="PLAN")]


PlanArg = Annotated[Path, typer.Argument(help="a plan file: YAML or Python", metavar="PLAN")]


def overrides(values: list[str] | None) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes KEY=VALUE, not {item!r}")
        result[key.strip()] = value
    return result


def fail(message: str, code: int = 2) -> typer.Exit:
    # Messages carry what a host sent (its errors, its stderr, job names): never a raw escape to the terminal.
    typer.echo(f"plan: {terminal_safe(message)}", err=True)
    return typer.Exit(code)


def output_file(path: Path, option: str) -> None:
    """A file an option names for the command to write (--html, --state): usage error (exit 2) unless it can be
    one, checked before anything is done: not a directory, in a directory that exists and can be written."""
    import os

    text = str(path)
    parent = os.path.dirname(os.path.abspath(text)) if text else ""
    if not text or text.endswith("/") or os.path.isdir(text):
        raise fail(f"{option} {text!r}: a directory, not a file")
    if not os.path.isdir(parent):
        raise fail(f"{option} {text!r}: no directory {parent}")
    if not os.access(parent, os.W_OK):
        raise fail(f"{option} {text!r}: the directory {parent} cannot be written")
    if len(os.fsencode(os.path.basename(text))) > 200:  # its temporary file beside it needs a longer name
        raise fail(f"{option} {text[:60]!r}...: a name too long")
    from runner.files import not_replaceable

    problem = not_replaceable(text)  # a FIFO would block the write, a device be replaced by it
    if problem:
        raise fail(f"{option} {problem}")


def say(text: str, err: bool = False, nl: bool = True) -> None:
    """TEXT that holds what a host sent (job names, reasons, its command output), made safe for a terminal."""
    typer.echo(terminal_safe(text), err=err, nl=nl)


def compile_one(
    path: Path, sets: list[str] | None, templates: list[Path] | None, no_cache: bool = False, lint: bool = True
):
    from plancompiler.compile import compile_plan

    try:
        progress = (lambda m: typer.echo(f"{path}: {m}", err=True)) if sys.stderr.isatty() else None
        return compile_plan(
            path,
            overrides(sets),
            templates or [],
            lint=lint,
            use_cache=not no_cache,
            progress=progress,
            limits=GLOBAL["limits"],
        )
    except (PlanFailure, typer.Exit, typer.BadParameter):
        raise
    except Exception as exc:  # a bug of ours: one line, exit 2, the traceback under --debug
        raise internal(str(path), exc) from exc


def internal(what: str | None, exc: BaseException) -> typer.Exit:
    if GLOBAL["debug"]:
        import traceback

        traceback.print_exception(exc)
    return fail(
        f"{what + ': ' if what else ''}internal error, please report ({type(exc).__name__}: {str(exc)[:200]})"
        + ("" if GLOBAL["debug"] else "; run with --debug for the traceback")
    )


def print_findings(compiled_list, fmt: Format, strict: bool, extra: Sequence[Diagnostic] = ()) -> int:
    diagnostics = [*extra, *(d for c in compiled_list for d in c.diagnostics)]
    text = format_all(diagnostics, fmt.value)
    if text:
        typer.echo(text)
    jobs = sum(c.job_count for c in compiled_list)
    if fmt is Format.text:
        typer.echo(summary(diagnostics, jobs), err=True)
    return 1 if has_errors(diagnostics, strict) else 0


HostsOpt = Annotated[
    Path | None, typer.Option("--hosts", metavar="FILE", help="hosts file (default $PLAN_HOSTS, else plans/hosts.yaml)")
]


HostArg = Annotated[
    str, typer.Argument(help="a name from the hosts file, a path (./q, /srv/jobs), or DEST:PATH", metavar="HOST")
]


def resolve_host(spec: str, hosts: Path | None):
    """HOST resolved; a hosts-file mistake is a located error (a PlanError: exit 2)."""
    from plancompiler.hosts import resolve

    return resolve(spec, hosts)


JobArg = Annotated[str, typer.Argument(help="the job's name (with or without .job)", metavar="JOB")]


GLOBAL: dict[str, Any] = {"debug": False, "limits": None, "max_size": None}
