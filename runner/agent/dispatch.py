"""`python3 -m runner agent MODE ROOT`: the host side of `plan` (push, status, watch, park, logs...), JSON in and out.

The workstation runs it over ssh (or locally) from the runner package it ships, so it reads and writes the
queue only through runner.jobfile, runner.queue and runner.controls. It exits 0 whenever it ran and reports a
queue it cannot read as {"error": ...} (a handler raises runner.errors.AgentError; `answer` alone turns it into
the answer): "could not reach", "the remote command failed" and "the queue says X" never mix. MODE `session`
answers one JSON request per line until stdin ends (a push holds its lock so)."""

from __future__ import annotations

import importlib
import json
import os
import sys

from runner.agent import wire
from runner.errors import AgentError
from runner.files import loads, parent_problem, root_problems

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict

    Handler = Callable[[str, Dict[str, Any]], Dict[str, Any]]

# Each request's handler as (module, function), imported when a request names it: an agent answering `status`
# (most of the calls `plan` makes) loads neither the push's delivery nor bootstrap's process starting.
QUEUE_HANDLERS: dict[str, tuple[str, str]] = {
    "probe": ("runner.agent.delivery", "probe"),
    "lock": ("runner.pushlock", "lock"),
    "install": ("runner.agent.delivery", "install"),
    "measure": ("runner.agent.delivery", "measure"),
    "status": ("runner.agent.handlers", "status"),
    "park": ("runner.agent.handlers", "park"),
    "control": ("runner.agent.handlers", "control"),
    "ack": ("runner.agent.handlers", "ack"),
    "add": ("runner.agent.adhoc", "add"),
    "logs": ("runner.agent.handlers", "logs"),
    "bootstrap": ("runner.agent.bootstrap", "bootstrap"),
}
# The Slurm backend's, likewise (a queue host never loads them).
SLURM_HANDLERS: dict[str, tuple[str, str]] = {
    "lock": ("runner.pushlock", "lock"),  # a push session's: held from its diff to its apply
    "push": ("runner.slurm.agent", "push"),
    "status": ("runner.agent.handlers", "slurm_status"),
    "history": ("runner.slurm.agent", "history"),
    "logs": ("runner.slurm.agent", "logs"),
}


def answer(mode: str, root: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request: the backend named in it picks the handler; any failure is answered as a value, here alone
    (an AgentError as it says, anything else as {"error": ...})."""
    try:
        return _handler(mode, root, request)(os.path.expanduser(root), request)
    except AgentError as exc:
        return exc.answer()
    except OSError as exc:  # the queue's own files: a root under a file, no permission, a full disk
        where = f" ({exc.filename})" if exc.filename else ""
        return {"error": f"{exc.strerror or exc}{where}"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _handler(mode: str, root: str, request: dict[str, Any]) -> Handler:
    """MODE's handler for ROOT, once ROOT is one a handler may look under."""
    root = os.path.expanduser(root)
    if os.path.lexists(root) and not os.path.isdir(root):
        raise AgentError(f"no queue at {root} ({root} is not a directory)")
    if not os.path.isdir(root) and not request.get("create") and not request.get("allow_missing"):
        raise AgentError(f"no queue at {root} (the directory does not exist)")
    # Nothing is read, written or run under a root another user could write to (runner.files: check_root).
    untrusted = root_problems(root) if os.path.isdir(root) else [p for p in [parent_problem(root)] if p]
    if untrusted:
        raise AgentError(f"refusing the queue root {root}: " + "; ".join(untrusted), untrusted=untrusted)
    backend = request.get("backend") or "queue"
    where = (SLURM_HANDLERS if backend == "slurm" else QUEUE_HANDLERS).get(mode)
    if where is None:
        raise AgentError(f"the {backend} backend has no {mode!r} request")
    handler: Handler = getattr(importlib.import_module(where[0]), where[1])
    return handler


def session(root: str) -> int:
    """One request per stdin line (a large one a compressed frame: runner/agent/wire.py), one answer per stdout
    line; locks taken here are released when stdin ends. A request cut short is never acted on."""
    try:
        while True:
            try:
                request = wire.read(sys.stdin.buffer)
            except ValueError as exc:  # its framing is lost: said, then the session ends
                sys.stdout.write(json.dumps({"error": f"the request is not readable: {exc}"}) + "\n")
                sys.stdout.flush()
                return 0
            if request is None:
                return 0
            if not isinstance(request, dict):
                request = {"mode": ""}
            sys.stdout.write(json.dumps(answer(str(request.pop("mode", "")), root, request)) + "\n")
            sys.stdout.flush()
    finally:
        _release()


def _release() -> None:
    """Every lock this agent holds released (and the roots it made for a push that never installed removed): a
    lock is taken, and a root made, only by runner.pushlock, which a request that takes none (status, most of
    them) never imports: its state lives in that module, so a process that has not imported it holds nothing."""
    taken = sys.modules.get("runner.pushlock")
    if taken is not None:
        taken.release_lock()


def main(argv: list[str]) -> int:
    """MODE ROOT; the request is JSON on stdin (one per line for `session`)."""
    if len(argv) != 2:
        sys.stderr.write("usage: python3 -m runner agent MODE ROOT  (JSON request on stdin)\n")
        return 2
    mode, root = argv
    if mode == "session":
        return session(root)
    raw = sys.stdin.read()
    try:
        request = loads(raw) if raw.strip() else {}
    except ValueError as exc:
        sys.stdout.write(json.dumps(AgentError(f"the request is not JSON: {exc}").answer()))
        return 0
    try:
        sys.stdout.write(json.dumps(answer(mode, root, request)))
    finally:
        _release()
    return 0
