"""ROOT/.push.lock: one push (or Slurm ledger writer) at a time per root, held from probe to install.

The lock is an flock on the file, so it ends with the descriptor: when the agent process exits, or when an
in-process agent (a local queue, see plancompiler/localagent.py) closes its session. What one agent holds is
its `Locks`: the process-wide one in an agent process, a session's own (set in `CURRENT`) in-process, so two
sessions in one process exclude each other as two processes do.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextvars import ContextVar

from runner.errors import AgentError
from runner.files import make_dirs, open_file, read_json_or_none
from runner.queue import timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOCK_NAME = ".push.lock"


class Locks:
    """The push locks one agent holds: root -> the descriptor of its lock file, and root -> the topmost
    directory taking the lock created for it (removed again, if still empty, by a push that never installed:
    a refused push leaves the host as it found it)."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.created: dict[str, str] = {}

    def keep(self, root: str) -> None:
        """ROOT is used now (a push installs there): releasing the lock must not remove it."""
        self.created.pop(root, None)


_PROCESS = Locks()  # an agent process's
CURRENT: ContextVar[Locks | None] = ContextVar("push_locks", default=None)  # an in-process session's


def _mine() -> Locks:
    return CURRENT.get() or _PROCESS


def _who() -> str:
    import getpass  # only by a lock taken without a `by` (getpass loads pwd's lookups and more)

    try:
        return f"{getpass.getuser()}@{os.uname().nodename}"
    except (OSError, KeyError):
        return "?"


def _holder(path: str) -> dict[str, Any]:
    holder = read_json_or_none(path)
    return holder if isinstance(holder, dict) else {}


def held(root: str) -> bool:
    return root in _mine().held


def keep_root(root: str) -> None:
    """ROOT is used now (a push installs there): releasing this agent's lock must not remove it."""
    _mine().keep(root)


def lock(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Take ROOT/.push.lock for this agent (until release_lock), waiting at most `wait_s`."""
    mine = _mine()
    if root in mine.held:
        return {"locked": True}
    if os.path.lexists(root) and not os.path.isdir(root):
        raise AgentError(f"{root} is not a directory (a queue root is one)")
    top = root
    while not os.path.lexists(os.path.dirname(top.rstrip("/")) or "/"):
        top = os.path.dirname(top.rstrip("/"))
    new = not os.path.lexists(root)
    make_dirs(root)
    if new:
        mine.created[root] = top
    path = os.path.join(root, LOCK_NAME)
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    deadline = time.monotonic() + float(request.get("wait_s", 60))
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            holder = _holder(path)
            os.close(fd)
            return {"busy": True, "holder": holder}
        time.sleep(0.05)
    holder = {"pid": os.getpid(), "user": request.get("by") or _who(), "since": timestamp(time.time())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    mine.held[root] = fd
    return {"locked": True}


def release_lock() -> None:
    """Release every lock this agent holds, and remove the roots it created for pushes that never installed."""
    mine = _mine()
    for root, fd in list(mine.held.items()):
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the descriptor releases the flock
        del mine.held[root]
    for root, top in list(mine.created.items()):
        _remove_unused(root, top)
        del mine.created[root]


def _remove_unused(root: str, top: str) -> None:
    """A root this agent created for a push that never installed: its lock file and the directories up to
    TOP, each only if empty (another push may have put something there meanwhile)."""
    try:
        os.unlink(os.path.join(root, LOCK_NAME))
        path = root.rstrip("/")
        while True:
            os.rmdir(path)
            if path == top.rstrip("/"):
                break
            path = os.path.dirname(path)
    except OSError:
        pass
