"""A Slurm submit host's status answer as the workstation takes it, for `plan status`, `watch` and `top` alike:
read by runner.slurm.statusitems into its frozen records, or an AgentError naming the host and the place."""

from __future__ import annotations

from typing import Any

from plancompiler.errors import AgentError, agent_error
from runner.slurm.statusitems import RecordError, parse_status_answer


def read_status(answer: dict[str, Any], where: str) -> dict[str, Any]:
    """ANSWER with its status and counts as they were read; an agent's error answer is passed on as it came
    (said by whoever asked: plancompiler.errors.answered)."""
    if agent_error(answer) is not None:
        return answer
    shown = parse_status_answer(answer)
    if isinstance(shown, RecordError):
        at = f" at {shown.where}" if shown.where else ""
        raise AgentError(f"{where}: the agent's status answer is malformed{at}: {shown.message}", where=where)
    return {**answer, "status": shown.to_json(), "counts": shown.counts.to_json()}
