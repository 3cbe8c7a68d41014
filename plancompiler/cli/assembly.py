"""`plan`'s typer app with every command group on it, and the root callback (--version, --debug, --max-size):
imported by the door (plancompiler/cli/__init__.py) when a command line needs typer, never for `plan --version`."""

from __future__ import annotations

import functools
from typing import Annotated, Any

import typer

from plancompiler.cli import compiling, looking, onejob, operating, pushing, reporting, watching
from plancompiler.cli.shared import GLOBAL, TemplatesOpt, app, edge, hooks_app, internal

__all__ = ["COMMAND_GROUPS", "TemplatesOpt", "app", "command", "internal"]
# imported for their @app.command()s
COMMAND_GROUPS = (compiling, pushing, watching, looking, reporting, operating, onejob)

app.add_typer(hooks_app, name="hooks")
for _info in (*app.registered_commands, *hooks_app.registered_commands):  # every command behind the one handler
    _info.callback = edge(_info.callback) if _info.callback is not None else None


def _version(value: bool) -> None:
    if value:
        from runner import banner

        typer.echo(banner("plan"))
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="on an internal error, print its traceback")] = False,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size",
            metavar="SIZE",
            help="most bytes one rendered value or job may have (default 1M; e.g. 4M) for check, render, push and run",
        ),
    ] = None,
) -> None:
    """plan: typed job plans in, checked job files out, and the queue they run in."""
    GLOBAL["debug"] = debug
    GLOBAL["limits"] = None
    GLOBAL["max_size"] = max_size
    if not max_size:
        return
    from plancompiler.sandbox import Limits, parse_size  # jinja2: only when a limit is given

    try:
        GLOBAL["limits"] = Limits(max_size=parse_size(max_size))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-size") from exc


@functools.cache
def command() -> Any:
    """The click command typer builds from every command's signature (~25 ms), built once per process."""
    return typer.main.get_command(app)
