"""`plan`'s light reader: a command line read from typer's own declarations, without typer's pydantic adapters.

Typer (0.29) builds a pydantic TypeAdapter for every parameter on every call: ~0.3 s before a command
starts. The commands are read here from the same `Annotated[..., typer.Option(...)]` declarations and called
as typer would call them; help, every mistake and any form not read here (short-option clusters, `--no-x`,
eager callbacks such as --version, sub-apps) are left to typer, so what a command receives and every message
about usage stay typer's.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

import typer


class Unsure(Exception):
    """The light parser leaves this command line to typer: help, a mistake, or a form it does not read."""


_NUMBER = {int: re.compile(r"-?[0-9]+"), float: re.compile(r"-?[0-9]+(\.[0-9]+)?")}


def _value(kind: Any, text: str) -> Any:
    """TEXT as KIND, where typer would surely read it the same way; else Unsure."""
    if kind is str:
        return text
    if kind is Path:
        return Path(text)
    if kind in _NUMBER:
        if not _NUMBER[kind].fullmatch(text):
            raise Unsure(text)
        return kind(text)
    if isinstance(kind, type) and issubclass(kind, Enum):
        for member in kind:
            if member.value == text:
                return member
    raise Unsure(text)


Declared = tuple[dict[str, tuple[str, Any, bool]], list[tuple[str, Any, bool]], dict[str, Any]]


def parse(fn: Any, args: list[str], command: bool) -> tuple[dict[str, Any], list[str]]:
    """ARGS read by FN's typer declarations: its keyword arguments, and (for the root) what follows."""
    import inspect

    params = inspect.signature(fn).parameters
    options, positional, kwargs = _declarations(fn, params, command)
    given, rest = _read_options(args, options, kwargs, command)
    if rest is not None:
        return kwargs, rest
    for name, kind, many in positional:
        if many:
            kwargs[name] = [_value(kind, t) for t in given]
            given = []
            if not kwargs[name]:
                raise Unsure(name)
        elif given:
            kwargs[name] = _value(kind, given.pop(0))
        elif name not in kwargs:
            raise Unsure(name)
    if given or any(name not in kwargs for name in params):
        raise Unsure("arguments")
    return kwargs, []


def _declarations(fn: Any, params: Any, command: bool) -> Declared:
    """FN's options (flag -> (parameter, type or None for typer, repeatable)), its arguments, and its defaults."""
    import inspect
    import typing

    from typer.models import ArgumentInfo, OptionInfo

    hints = typing.get_type_hints(fn, include_extras=True)
    options: dict[str, tuple[str, Any, bool]] = {}
    positional: list[tuple[str, Any, bool]] = []
    kwargs: dict[str, Any] = {}
    for name, hint in hints.items():
        if name == "return":
            continue
        info = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, (OptionInfo, ArgumentInfo))), None)
        kind, many = _kind(hint.__origin__ if info is not None else hint)
        if isinstance(info, OptionInfo):
            decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str)]
            if not decls or any("/" in d for d in decls):
                raise Unsure(name)
            for decl in decls:  # an option with a callback (--version) is typer's to run
                options[decl] = (name, None if info.callback is not None else kind, many)
        elif command:
            positional.append((name, kind, many))
        else:
            raise Unsure(name)
        default = params[name].default
        if isinstance(info, OptionInfo) and info.callback is not None:
            kwargs[name] = None  # what typer passes for an eager option (--version) not given
        elif default is not inspect.Parameter.empty:
            kwargs[name] = default
    return options, positional, kwargs


def _kind(kind: Any) -> tuple[Any, bool]:
    """The type one value of a parameter declared as KIND is read as, and whether it repeats (list[...])."""
    import types
    import typing

    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    many = typing.get_origin(kind) is list
    if many:
        kind = typing.get_args(kind)[0]
    return kind, many


def _read_options(
    args: list[str], options: dict[str, tuple[str, Any, bool]], kwargs: dict[str, Any], command: bool
) -> tuple[list[str], list[str] | None]:
    """The options of ARGS into KWARGS; the positional arguments, and (for the root) the command line after it."""
    given: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--" and command:
            given.extend(args[i + 1 :])
            break
        if token.startswith("-") and token != "-":
            i = _option(args, i, options, kwargs)
        elif not command:
            return given, args[i:]  # the command's name: the root's options end here
        else:
            given.append(token)
        i += 1
    if not command:
        raise Unsure("no command")
    return given, None


def _option(args: list[str], i: int, options: dict[str, tuple[str, Any, bool]], kwargs: dict[str, Any]) -> int:
    """The option at ARGS[I] into KWARGS; the index of its last token (its value's, where it takes one)."""
    token = args[i]
    flag, eq, inline = token.partition("=")
    if flag not in options or (eq and not flag.startswith("--")):
        raise Unsure(token)
    name, kind, many = options[flag]
    if kind is None:
        raise Unsure(token)
    if kind is bool:
        if eq:
            raise Unsure(token)
        kwargs[name] = True
        return i
    if not eq:
        i += 1
        if i == len(args):
            raise Unsure(token)
        inline = args[i]
    value = _value(kind, inline)
    kwargs[name] = [*(kwargs.get(name) or []), value] if many else value
    return i


def read(
    app: typer.Typer, root_fn: Callable[..., Any], argv: list[str]
) -> tuple[Any, dict[str, Any], dict[str, Any]] | None:
    """(command, its arguments, the root callback's) as typer would call them, or None to let typer read ARGV."""
    if not argv or "--help" in argv or os.environ.get("_PLAN_COMPLETE"):
        return None  # help, and click's shell completion (asked for through the environment), are typer's
    try:
        root, rest = parse(root_fn, argv, command=False)
        commands = {
            (info.name or info.callback.__name__).lower().replace("_", "-"): info.callback
            for info in app.registered_commands
            if info.callback is not None
        }
        if not rest or rest[0] not in commands:
            return None
        kwargs, _ = parse(commands[rest[0]], rest[1:], command=True)
    except Unsure:
        return None
    return commands[rest[0]], kwargs, root


def run(root_fn: Callable[..., Any], command: Any, kwargs: dict[str, Any], root: dict[str, Any]) -> int | None:
    """Run COMMAND as typer's standalone mode would; None where typer must read the line again."""
    # click's base error, found through typer's public class: typer vendors click in newer releases.
    click_error: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        try:
            root_fn(**root)
        except click_error:
            return None  # a bad --max-size: typer says so in its words
        command(**kwargs)
    except typer.Exit as exc:
        return exc.exit_code
    except click_error:
        return None  # raised before anything was done (--set KEY=VALUE): typer reports it
    except KeyboardInterrupt as exc:  # 128 + the signal, as a shell says it: Ctrl-C 130, `plan run`'s TERM 143
        return 128 + int(getattr(exc, "signum", signal.SIGINT))
    except EOFError:
        typer.echo("", err=True)
        typer.echo("Aborted!", err=True)
        return 1
    except BrokenPipeError:
        sys.stdout = sys.stderr = open(os.devnull, "w")
        return 1
    return 0
