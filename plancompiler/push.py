"""Stage 6, push: diff a checked plan against a host, show it, then apply it, all through the host's backend."""

from __future__ import annotations

from collections.abc import Callable

from plancompiler.backends import backend_for
from plancompiler.backends.protocol import PushOptions, PushOutcome, PushPlan, PushSession, Refused
from plancompiler.compile import Compiled, cycles_unsearched
from plancompiler.errors import Interrupted
from plancompiler.hosts import Host

__all__ = ["PushOptions", "PushOutcome", "PushPlan", "Refused", "push"]


def push(compiled: Compiled, host: Host, options: PushOptions, show: Callable[[PushPlan], None]) -> PushOutcome:
    """Probe the host (holding its push lock unless dry), SHOW the diff, then apply it unless refused or dry.

    Unreachable and RemoteFailed from the host, and Refused (lock busy, queue changed), propagate; a Ctrl-C is
    Interrupted, saying whether the push was applied."""
    applied: PushOutcome | None = None
    try:
        with cycles_unsearched(), backend_for(host).push_session(options) as session:
            diff = session.diff(compiled, options)
            show(diff)
            if diff.errors:
                return PushOutcome(diff, notes=["plan: push refused; nothing was changed"])
            if options.dry_run:
                return PushOutcome(diff, notes=["dry run: nothing was changed"])
            if not diff.has_work():
                return PushOutcome(diff, notes=["nothing to push"])
            try:
                applied = session.apply(diff)
            except KeyboardInterrupt:
                raise Interrupted(_after_apply(session, diff, host)) from None
        return applied
    except KeyboardInterrupt:
        if applied is not None:  # while the session closed (its lock released): the install had ended whole
            raise Interrupted(f"interrupted after the install: {_APPLIED.format(host.name)}") from None
        raise Interrupted(f"interrupted before the push was applied: nothing was changed on {host.name}") from None


_APPLIED = "the push was applied on {} (`plan status` shows its queue)"


def _after_apply(session: PushSession, diff: PushPlan, host: Host) -> str:
    """What an interrupted apply did (an install, once begun, ends whole: it is asked of the host after)."""
    try:
        landed = session.landed(diff)
    except KeyboardInterrupt:
        landed = None
    if landed:
        return f"interrupted after the install: {_APPLIED.format(host.name)}"
    if landed is False:
        return f"interrupted before the install: the push was not applied; nothing was changed on {host.name}"
    return (
        f"interrupted while the push was applied on {host.name}: whether it was is not known; "
        "`plan push --dry-run` shows what is left to do"
    )
