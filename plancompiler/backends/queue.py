"""A host whose queue directory a stdlib runner serves: a push through its agent, status, reports, operations.

The diff rules are in backends/queuediff.py, the runner's health in backends/queuehealth.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from plancompiler.backends.protocol import PushOptions, PushOutcome, PushPlan, Refused, ReportSource, who
from plancompiler.backends.queuediff import add_costs, diff, plan_record, rerun_paths
from plancompiler.backends.queuehealth import health
from plancompiler.errors import PlanFailure, agent_error, answered
from plancompiler.hosts import AgentSession, Host
from runner import identity

if TYPE_CHECKING:  # status, watch and the operate commands never compile: no pydantic, no jinja2
    from plancompiler.compile import Compiled

CHANGED = "the queue changed since this push looked at it; run it again"
__all__ = ["CHANGED", "QueueBackend", "QueuePushSession", "busy_message", "diff", "health", "plan_record"]


def take_push_lock(host: Host, session: AgentSession, options: PushOptions) -> None:
    """Hold ROOT/.push.lock through SESSION from probe to install (both backends), or say who holds it."""
    got = session.ask(
        "lock",
        {**host.context(), "wait_s": options.lock_wait_s, "by": who(), "create": True},
        options.lock_wait_s + host.timeout,
    )
    if got.get("busy"):
        raise Refused(busy_message(host, got.get("holder") or {}))
    answered(got, host.describe(), Refused)


def busy_message(host: Host, holder: dict[str, Any]) -> str:
    return (
        f"another push to {host.name} is in progress (pid {holder.get('pid', '?')}, "
        f"{holder.get('user', '?')}, since {holder.get('since', '?')}); try again when it is done"
    )


class QueuePushSession:
    """Probe and install through one agent process, which holds ROOT/.push.lock from probe to install."""

    def __init__(self, host: Host, session: AgentSession) -> None:
        self.host = host
        self.session = session

    def diff(self, compiled: Compiled, options: PushOptions) -> PushPlan:
        external = list(compiled.graph.external) if options.verify_external and compiled.graph else []
        probe = self.session.ask(
            "probe",
            {
                **self.host.context(),
                "external": external,
                "allow_missing": True,
                "client": identity(),  # who is asking: the box judges whether this client may write there
            },
        )
        answered(probe, self.host.describe(), Refused)
        result = diff(compiled, self.host, probe, options)
        paths = rerun_paths(result, compiled)
        if paths:  # what the reruns would redo, asked of the box in the same session (only what runs again)
            sizes = self.session.ask("measure", {**self.host.context(), "paths": paths}).get("sizes")
            add_costs(result, compiled, sizes)
        return result

    def apply(self, plan: PushPlan) -> PushOutcome:
        result = self.session.ask("install", {**self.host.context(), **plan.request, "create": True, "by": who()})
        if result.get("busy"):
            raise Refused(busy_message(self.host, result.get("holder") or {}))
        if result.get("changed"):
            raise Refused(CHANGED)
        answered(result, self.host.describe(), Refused)
        notes = [
            f"note: {state}/{name} had already moved (the runner took it) when the push came to change it"
            for state, name in result.get("gone", [])
        ]
        notes += [
            f"stopping {name}: a cancel request the runner carries out as `plan cancel` (it goes to failed/)"
            for name in result.get("stopping", [])
        ]
        notes.append(f"pushed: {len(result.get('installed', []))} installed, {len(result.get('removed', []))} removed")
        return PushOutcome(plan, True, notes)

    def landed(self, plan: PushPlan) -> bool | None:
        """Whether PLAN's install was made: every install moves the manifest's generation, and this session
        still holds the push lock, so no other push moved it since PLAN's probe."""
        before = plan.request.get("generation")
        try:
            now = self.session.ask("probe", {**self.host.context(), "allow_missing": True, "client": identity()})
        except (PlanFailure, OSError):
            return None
        after = now.get("generation")
        if not isinstance(before, int) or not isinstance(after, int) or agent_error(now):
            return None
        return after > before


class QueueBackend:
    def __init__(self, host: Host) -> None:
        self.host = host

    @contextmanager
    def push_session(self, options: PushOptions) -> Iterator[QueuePushSession]:
        session = self.host.session()
        try:
            if not options.dry_run:
                take_push_lock(self.host, session, options)
            yield QueuePushSession(self.host, session)
        finally:
            session.close()

    def status(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.host.call("status", request, timeout)

    def report_source(self, since: str | None, plan: str | None = None) -> ReportSource:
        import json

        answer = answered(self.host.call("status", {"offset": 0, "max_bytes": 1 << 30}, 300), self.host.describe())
        return ReportSource("\n".join(json.dumps(e) for e in answer.get("events", [])), status=answer)

    def operate(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.host.call(mode, request, timeout)
