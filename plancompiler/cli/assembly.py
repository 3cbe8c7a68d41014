"""The `plan` command: parses arguments, calls one stage function, prints, returns an exit code.

One module per command group, each declaring its commands on the shared typer app (plancompiler/cli/shared.py):
compiling (check, render, graph, schema), pushing (push, run), watching (status, watch, ack), looking (top), reporting
(report), operating (park, unpark, retry, cancel, logs, bootstrap, hooks install), onejob (add, hold, release,
move). A new command group is a new
module here, imported below; `light` reads a command line from those declarations without typer's pydantic
adapters, for a fast start."""

from __future__ import annotations

import functools
import sys
from typing import Annotated, Any

import typer

from plancompiler.cli import compiling, looking, onejob, operating, pushing, reporting, watching
from plancompiler.cli.shared import GLOBAL, TemplatesOpt, app, edge, hooks_app, internal

__all__ = ["TemplatesOpt", "app", "command", "main"]
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


def main(argv: list[str] | None = None) -> int:
    from plancompiler.cli import light

    args = sys.argv[1:] if argv is None else list(argv)
    for stream in (sys.stdout, sys.stderr):
        # A file name is bytes, not always UTF-8 ($'a\xff.yaml' is a name): printed back as the same bytes, as
        # the C locale's streams do, never an encoding error under a UTF-8 one.
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    read = light.read(app, _root, args)
    if read is not None:
        try:
            code = light.run(_root, *read)
        except Exception as exc:  # never a traceback and never exit 1 for a bug of ours
            internal(None, exc)
            return 2
        if code is not None:
            return code
    try:
        command()(args=args, prog_name="plan")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:  # never a traceback and never exit 1 for a bug of ours
        internal(None, exc)
        return 2
    return 0
