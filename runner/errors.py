"""The runner's errors, one family: a message and the exit code `python3 -m runner` ends with.

The host agent's kind, `AgentError`, is never raised at `plan`: a handler raises it, and the agent answers it as
{"error": MESSAGE, ...} (`AgentError.answer`, serialised in one place: runner.agent.dispatch); the plan side
types that answer into its own family (plancompiler/errors.py: `answered`, and `ControllerDown` from the
answer's `controller_down`)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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


class AgentError(RunnerError):
    """A request the host agent refuses or cannot carry out (no queue there, a bad job name, a job that would
    not run): answered as {KEY: MESSAGE, **DETAILS}."""

    key = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details

    def answer(self) -> dict[str, Any]:
        return {self.key: str(self), **self.details}


class ControllerDown(AgentError):
    """Slurm's controller (squeue, sbatch, scontrol) could not be run or did not answer: the cluster, not the
    queue, is unreachable. Answered as {"controller_down": MESSAGE}; `plan` raises its ControllerDown (exit 3)."""

    key = "controller_down"
