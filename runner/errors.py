"""The runner's errors, one family: a message and the exit code `python3 -m runner` ends with. The host agent
never raises them at `plan`: it answers {"error": MESSAGE} (plancompiler/errors.py types that on the plan side)."""

from __future__ import annotations


class RunnerError(Exception):
    """The base: MESSAGE and the exit CODE (the class's unless given)."""

    code = 2

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class Untrusted(RunnerError):
    """A queue root (or a directory in it) that another user could write to: nothing under it is run: exit 2."""


class AlreadyRunning(RunnerError):
    """Another runner holds the root's lock (ROOT/.runner.lock): exit 3."""

    code = 3
