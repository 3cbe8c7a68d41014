"""Stage 6, push: diff a checked plan against a host, show it, then apply it, all through the host's backend."""

from __future__ import annotations

from collections.abc import Callable

from plancompiler.backends import backend_for
from plancompiler.backends.protocol import PushOptions, PushOutcome, PushPlan, Refused
from plancompiler.compile import Compiled
from plancompiler.hosts import Host

__all__ = ["PushOptions", "PushOutcome", "PushPlan", "Refused", "push"]


def push(compiled: Compiled, host: Host, options: PushOptions, show: Callable[[PushPlan], None]) -> PushOutcome:
    """Probe the host (holding its push lock unless dry), SHOW the diff, then apply it unless refused or dry.

    Unreachable and RemoteFailed from the host, and Refused (lock busy, queue changed), propagate."""
    with backend_for(host).push_session(options) as session:
        diff = session.diff(compiled, options)
        show(diff)
        if diff.errors:
            return PushOutcome(diff, notes=["plan: push refused; nothing was changed"])
        if options.dry_run:
            return PushOutcome(diff, notes=["dry run: nothing was changed"])
        if not diff.has_work():
            return PushOutcome(diff, notes=["nothing to push"])
        return session.apply(diff)
