"""A push's install left pending (ROOT/.install.json, runner.agent.delivery): finished by the runner once its push
is gone (its lock free, as when it was killed during its renames); no job starts while it is there.

An install that cannot be finished (an OSError: a directory where a job file lands, a staged file it may not read,
a full disk) is tried again every tick, and heard once per cause: an `install-stuck` event, the reason
`install-pending` (its blocker the error) on every lane it holds, and the `install-stuck` incident
(runner.alerts.causes). Its end, whoever finished it, is an `install-finished` event.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from runner.queue import INSTALL_RECORD, Queue, pending_install
from runner.service.announce import Announcer, LaneView
from runner.service.jobs import Jobs
from runner.vocab import Event, Reason


def _why(exc: OSError) -> str:
    """The error as one line naming the file in the way (a rename's target): the same cause reads the same every
    tick."""
    where = exc.filename2 if exc.filename2 is not None else exc.filename
    if exc.strerror is None or where is None:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc.strerror}: {os.fsdecode(where)}"


class PendingInstall:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.root = str(queue.root)
        self.stuck = ""  # why the pending install cannot be finished; "" while none is pending or it was not tried
        self.stuck_since: float | None = None
        self._said = ""  # the cause the last install-stuck event named

    def check(self, now: float, retry: bool = True) -> bool:
        """Finish the pending install if its push is gone; True while one is still pending. One that is stuck is
        tried again only where RETRY (the sweep's clock): each try may write control/ requests, which wake the
        runner, and the queue must not spin on a cause that lasts."""
        if not pending_install(self.root):
            self._finished(now, "a push")  # another finished it (the next push, under its lock)
            return False
        if self.stuck and not retry:
            return True
        # The push side (hashing, staging, the lock's bookkeeping) is loaded by a runner that finds an install to
        # finish, not by every runner's start.
        from runner import pushlock
        from runner.agent import delivery

        tried = False
        try:
            if pushlock.lock(self.root, {"wait_s": 0, "by": "runner (an install left pending)"}).get("locked"):
                tried = True
                try:
                    delivery.finish_pending(self.root)
                finally:
                    pushlock.release_lock()
        except OSError as exc:  # tried again next sweep; meanwhile nothing starts, and that is said
            self._stuck(now, _why(exc))
        if pending_install(self.root):
            return True
        self._finished(now, "the runner", tried)
        return False

    def _stuck(self, now: float, why: str) -> None:
        if self.stuck_since is None:
            self.stuck_since = now
        self.stuck = why
        if why != self._said:  # once per cause, not every tick
            self._said = why
            self.queue.emit(
                now,
                "-",
                Event.INSTALL_STUCK.value,
                error=why[:500],
                record=INSTALL_RECORD,
                stuck_s=round(now - self.stuck_since, 1),
            )

    def _finished(self, now: float, by: str, tried: bool = False) -> None:
        """The install is finished: said where it was stuck (the recovery), or where this runner finished one its
        push left (killed during its renames)."""
        if self.stuck_since is not None or tried:
            stuck = {"stuck_s": round(now - self.stuck_since, 1)} if self.stuck_since is not None else {}
            self.queue.emit(now, "-", Event.INSTALL_FINISHED.value, by=by, **stuck)
        self.stuck, self.stuck_since, self._said = "", None, ""

    def hold_lanes(self, now: float, announcer: Announcer, jobs: Jobs, lanes: Iterable[str]) -> None:
        """Every lane's view says what holds it, while the install is stuck (a lane event each, once)."""
        if not self.stuck:
            return
        for lane in lanes:
            runs = jobs.in_lane(lane)
            state, job = ("busy", runs[0].filename) if runs else ("waiting", "")
            many = len(runs) if runs and announcer.config.slots_of(lane) > 1 else 0
            announcer.set_lane(now, lane, LaneView(state, job, Reason.INSTALL_PENDING.value, self.stuck[:200], many))
