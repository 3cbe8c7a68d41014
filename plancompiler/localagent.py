"""The agent of a local queue, answered in this process: the same `runner.agent.dispatch` handlers a host runs, with
no interpreter to start (an agent process costs ~0.1 s of CPU, and `plan status` of a local queue was one).

What a process boundary gave, this keeps: each request and answer goes through JSON as over a pipe; a request
is bounded by the host's timeout (it runs in a thread; past the limit the call is `Unreachable` and the
thread is left behind, as a hung agent process was, and a lock it takes after that is let go); a session
holds its own push locks (`pushlock.Locks`), released on close, so two sessions exclude each other even in
one process. An install alone runs in a forked copy of this process, in a session of its own holding the
session's lock through the descriptor it inherits, so neither Ctrl-C nor kill -9 of `plan` cuts a push between its
files; Ctrl-C during a park or bootstrap waits for it to end, then takes effect.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import threading
import time
from types import FrameType
from typing import Any

from plancompiler.transport import Endpoint, RemoteFailed, Unreachable, check_timeout, classify, limit_for
from runner import pushlock
from runner.agent import dispatch as agent
from runner.pushlock import Locks

_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Interrupted at once: they read, or wait (for the push lock, for the runner to take a request) before writing
# one file whole. The others are deferred until they end; an install even runs as a process of its own.
INTERRUPTIBLE = frozenset({"status", "logs", "probe", "measure", "history", "lock", "control"})


class _Deferred:
    """SIGINT/SIGTERM/SIGHUP held back while a request runs (main thread only), delivered once it ended."""

    def __init__(self) -> None:
        self.caught: list[int] = []
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> _Deferred:
        if threading.current_thread() is threading.main_thread():
            for sig in _DEFERRED:
                self.saved[sig] = signal.signal(sig, self._hold)
        return self

    def _hold(self, sig: int, frame: FrameType | None) -> None:
        self.caught.append(sig)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(self.caught):
            signal.raise_signal(sig)


class LocalSession:
    """An in-process agent on ENDPOINT's root answering several requests; what it locked stays locked until
    close(). Its answers are classified as an agent process's are (transport.classify)."""

    def __init__(self, endpoint: Endpoint, timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.root = endpoint.root
        self.timeout = limit_for(timeout, endpoint)
        self.locks = Locks()
        self.answered = 0
        self.closed = False

    def ask(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The answer to REQUEST in MODE, as JSON would carry it; Unreachable past the limit."""
        limit = self.timeout if timeout is None else check_timeout(timeout)
        if mode == "install":
            with _Deferred():
                answer = self._install_apart(request, limit)
            self.answered += 1
            return classify(self.endpoint, answer)
        payload = json.loads(json.dumps(request))
        box: dict[str, str] = {}

        def work() -> None:
            pushlock.CURRENT.set(self.locks)
            box["answer"] = json.dumps(agent.answer(mode, self.root, payload))
            if self.closed:  # a lock taken after the session gave up waiting and closed: not kept
                pushlock.release_lock()

        worker = threading.Thread(target=work, name=f"agent-{mode}", daemon=True)
        worker.start()
        if mode in INTERRUPTIBLE:
            worker.join(limit)
        else:
            with _Deferred():
                worker.join(limit)
        if "answer" not in box:
            ended = "the agent ended without answering"
            raise Unreachable(
                f"{self.endpoint.label}: " + (f"no answer within {limit:g}s" if worker.is_alive() else ended)
            )
        self.answered += 1
        return classify(self.endpoint, json.loads(box["answer"]))

    def _install_apart(self, request: dict[str, Any], limit: float) -> Any:
        """An install in a forked copy of this process, in a session of its own, holding this session's push
        lock through the descriptor it inherits: a `plan` killed meanwhile (kill -9, its terminal closed) does
        not cut it between files, as an agent process on a host is not. (Forked, not started: no interpreter
        to start, no module to import again.) Past LIMIT it is killed, as a hung agent process was."""
        payload = request if _plain(request) else json.loads(json.dumps(request))  # the fork's copy is its own
        self.locks.keep(self.root)  # an install lands here: closing must not remove the root
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only the install, its answer down the pipe, and out without Python's exit
            code = 1
            try:
                os.close(read_end)
                os.setsid()
                pushlock.CURRENT.set(self.locks)  # its copy: the lock's descriptor inherited, never released here
                out = json.dumps(agent.answer("install", self.root, payload)).encode()
                while out:
                    out = out[os.write(write_end, out) :]
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            data = _read_within(read_end, limit)
        finally:
            os.close(read_end)
        if data is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise Unreachable(f"{self.endpoint.label}: no answer within {limit:g}s")
        _, status = os.waitpid(pid, 0)
        if not data:
            raise RemoteFailed(f"{self.endpoint.label}: the install ended without answering (status {status})")
        return json.loads(data)

    def close(self) -> None:
        """Release what this session locked (and a root it created for a push that never installed)."""
        self.closed = True
        token = pushlock.CURRENT.set(self.locks)
        try:
            pushlock.release_lock()
        finally:
            pushlock.CURRENT.reset(token)


def call(endpoint: Endpoint, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """One request and its answer, its locks released after, as a one-shot agent process did."""
    session = LocalSession(endpoint, timeout)
    try:
        return session.ask(mode, request)
    finally:
        session.close()


_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """VALUE is already what JSON would carry: dicts with str keys, lists, str, int, float, bool and None, no
    container in two places. (A push's install request of 10,000 jobs: checked in ~2/3 of a round trip's time.)"""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if any(type(key) is not str for key in item):
                return False
            children: Any = item.values()
        elif type(item) is list:
            children = item
        else:
            if type(item) not in _SCALARS:
                return False
            continue
        if id(item) in seen:
            return False
        seen.add(id(item))
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append(child)
            elif kind not in _SCALARS:
                return False
    return True


def _read_within(fd: int, limit: float) -> bytes | None:
    """All of FD until its writer closes it, or None if that takes longer than LIMIT."""
    deadline = time.monotonic() + limit
    chunks: list[bytes] = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
