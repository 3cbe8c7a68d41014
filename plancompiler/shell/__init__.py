"""Values put into bash safely: the escaper (`escape`, by the place a value lands) and the shell reader beneath it
that finds those places in a template's text (scan, places, frame, commands, tables, verdicts).

This is the door: the rest of plancompiler imports only the names below, from `plancompiler.shell`."""

from __future__ import annotations

from plancompiler.shell.context import (
    HEREDOC_CLOSE,
    ContextError,
    Escaped,
    Shell,
    ValueRefused,
    escape,
    finish_heredocs,
    shell_environment,
)

__all__ = [
    "HEREDOC_CLOSE",
    "ContextError",
    "Escaped",
    "Shell",
    "ValueRefused",
    "escape",
    "finish_heredocs",
    "shell_environment",
]
