"""Every error `plan` reports, one family: a message, the exit code the command ends with, and where it happened
(a file, a host) when that is known.

Errors are values until the command line prints them: a stage raises one of these, nothing catches it to turn
it into text on the way, and one handler at the command line's edge (plancompiler/cli/shared.py, `edge`) prints
`plan: MESSAGE` and exits with its code. Findings in a plan are not errors: they are Diagnostics, printed as a
list (plancompiler/diagnostics.py). Exit codes: 1 refused or failed on the host, 2 usage or I/O, 3 unreachable.
"""

from __future__ import annotations

from typing import Any


class PlanFailure(Exception):
    """The base: MESSAGE, the exit CODE (the class's unless given) and WHERE (a file or a host), if known."""

    code = 2

    def __init__(self, message: str, code: int | None = None, where: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.where = where


class PlanError(PlanFailure):
    """A usage or I/O problem that stops the pipeline before it can produce findings (exit 2)."""


class PlanFileError(PlanError):
    """A plan (or hosts) file that is missing, unreadable or cannot be imported: exit 2, WHERE naming the file.
    Not a finding: there is no plan to find anything in. `plan check` reports the other plans' findings first."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}", where=where)
        self.message = message


class Unreachable(PlanFailure):
    """The host could not be reached (ssh exit 255, the overall timeout, its cluster not answering): exit 3."""

    code = 3


class ControllerDown(Unreachable):
    """On Slurm: the submit host answered, its controller did not. The controller is the runner there."""


class RemoteFailed(PlanFailure):
    """The host was reached but the command there failed (exit 1)."""

    code = 1


class AgentError(PlanFailure):
    """The host's agent answered, and its answer is an error: the queue there cannot be read, or a request was
    refused (exit 1). The agent says so as {"error": MESSAGE}; `answered` turns that into this."""

    code = 1


class Refused(PlanFailure):
    """The host will not take this push now (another push holds its lock, or the queue changed): exit 1."""

    code = 1


class OperateError(PlanFailure):
    """The host answered, but the operation did not happen (exit 1 unless said)."""

    code = 1


class Interrupted(PlanFailure):
    """Ctrl-C (or SIGTERM's KeyboardInterrupt) during a change on a host, said with whether the change was made
    (exit 130, as a shell reports a SIGINT)."""

    code = 130


class AckError(PlanFailure):
    """`plan ack` could not pick one incident (exit 2 usage, 1 nothing to ack)."""


def agent_error(answer: dict[str, Any]) -> str | None:
    """What the host's agent said went wrong, when ANSWER is its error (runner.errors.AgentError.answer); else
    None. The one reader of that key: a Slurm controller's silence never comes this far (the transport raises
    ControllerDown for it)."""
    said = answer.get("error")
    return None if said is None else str(said)


def answered(answer: dict[str, Any], where: str, error: type[PlanFailure] = AgentError) -> dict[str, Any]:
    """ANSWER, when the agent's answer is not an error; else ERROR "WHERE: its message" (WHERE names the host)."""
    said = agent_error(answer)
    if said is not None:
        raise error(f"{where}: {said}", where=where)
    return answer
