"""The Slurm agent's answers (runner.slurm.agent: a push, a report's history) typed where they reach the
workstation: parsed once, each a frozen record, or a located error naming the host and the field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from plancompiler.errors import AgentError

SlurmId = int | str  # a job's id, or ARRAY_N for an array's element


class _Answer(BaseModel):
    # keys a newer agent adds are not this version's business; a known key of the wrong kind is an error
    model_config = ConfigDict(extra="ignore", frozen=True)


class PushAnswer(_Answer):
    """A push's diff, and once applied what it did (submitted, re-pointed, cancelled) or why it was refused."""

    changes: tuple[tuple[str, str, str], ...] | None = None  # [mark, name, note]; None: refused before diffing
    external_missing: tuple[str, ...] = ()
    submitted: dict[str, SlurmId] = {}
    repointed: dict[str, tuple[str, ...]] = {}
    cancelled: tuple[SlurmId, ...] = ()
    withdrawn: tuple[str, ...] = ()  # what a push that failed part-way cancelled of its own
    retried: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    rebuilt: str = ""  # what rebuilding an untrusted ledger did
    accounting: str = ""
    error: str = ""
    token: str = ""  # the diff the agent keeps for this session to apply
    busy: bool = False
    holder: dict[str, Any] = {}
    changed: str = ""  # what changed in Slurm since the diff was shown


class HistoryAnswer(_Answer):
    """The ledger's attempts as events with Slurm's clocks, for `plan report`."""

    accounting: bool = False
    why: str = ""
    events: tuple[dict[str, Any], ...] = ()
    plans: tuple[str, ...] = ()
    error: str = ""


def _parse(kind: type[_Answer], answer: Any, where: str, what: str) -> Any:
    try:
        return kind.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(the answer)"
        said = f"{where}: the agent's {what} answer is malformed at {field}: {first['msg']}"
        raise AgentError(said, where=where) from None


def push_answer(answer: Any, where: str) -> PushAnswer:
    """ANSWER as a PushAnswer, or an AgentError naming WHERE (the host) and the field that is wrong."""
    found: PushAnswer = _parse(PushAnswer, answer, where, "push")
    return found


def history_answer(answer: Any, where: str) -> HistoryAnswer:
    """ANSWER as a HistoryAnswer, or an AgentError naming WHERE (the host) and the field that is wrong."""
    found: HistoryAnswer = _parse(HistoryAnswer, answer, where, "history")
    return found
