"""The `plan` command: parses arguments, calls one stage function, prints, returns an exit code.

One module per command group, each declaring its commands on the shared typer app (plancompiler/cli/shared.py):
compiling (check, render, graph, schema), pushing (push, run), watching (status, watch, ack), looking (top), reporting
(report), operating (park, unpark, retry, cancel, logs, bootstrap, hooks install), onejob (add, hold, release,
move). A new command group is a new module, imported by `assembly` (the app with every group on it); `light`
reads a command line from those declarations without typer's pydantic adapters, for a fast start. This door
imports neither until a command line needs them: `plan --version` prints without typer."""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plancompiler.cli.assembly import COMMAND_GROUPS, TemplatesOpt, _root, app, command

__all__ = ["COMMAND_GROUPS", "TemplatesOpt", "_root", "app", "command", "entry", "main"]
_ASSEMBLED = frozenset(__all__) - {"main", "entry"}


def __getattr__(name: str) -> Any:
    """The typer app and its parts, from plancompiler/cli/assembly.py when first asked for."""
    if name in _ASSEMBLED:
        from plancompiler.cli import assembly

        return getattr(assembly, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:  # what the root callback's eager --version prints, without loading typer
        from runner import banner

        print(banner("plan"))
        return 0
    from plancompiler.cli import light
    from plancompiler.cli.assembly import _root, app, command, internal

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


def entry() -> int:
    """The `plan` program (its console script and `python -m plancompiler.cli`): main, then what it made is kept
    out of the interpreter's last search for garbage cycles at exit. Everything is freed as the process ends; that
    search walked every object a command made first (at 10 000 jobs pushed, 0.13-0.22 s of a 1.2-2 s push; frozen,
    20-30 ms). Not in main, which tests call in-process."""
    code = main()
    gc.freeze()
    return code
