"""The agent of a local queue, answered in this process: the same `runner.agent` handlers a host runs, with
no interpreter to start (an agent process costs ~0.1 s of CPU, and `plan status` of a local queue was one).

What a process boundary gave, this keeps: each request and answer goes through JSON as over a pipe; a request
is bounded by the host's timeout (it runs in a thread; past the limit the call is `Unreachable` and the
thread is left behind, as a hung agent process was); a session holds its own push locks (`pushlock.Locks`),
released on close, so two sessions exclude each other even in one process; and an interrupt while a request that
writes runs waits for that request to end (a push is never cut between its files, as an agent process in its
own session was not), then takes effect.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from types import FrameType
from typing import Any

from plancompiler.transport import Endpoint, Unreachable, check_timeout, classify, limit_for
from runner import agent, pushlock
from runner.pushlock import Locks

_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
READ_ONLY = frozenset({"status", "logs", "probe", "history"})  # interrupted at once: nothing to cut in half


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

    def ask(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The answer to REQUEST in MODE, as JSON would carry it; Unreachable past the limit."""
        limit = self.timeout if timeout is None else check_timeout(timeout)
        payload = json.loads(json.dumps(request))
        box: dict[str, str] = {}

        def work() -> None:
            pushlock.CURRENT.set(self.locks)
            box["answer"] = json.dumps(agent.answer(mode, self.root, payload))

        worker = threading.Thread(target=work, name=f"agent-{mode}", daemon=True)
        deadline = time.monotonic() + limit
        worker.start()
        if mode in READ_ONLY:
            worker.join(limit)
        else:
            with _Deferred():
                worker.join(max(0.0, deadline - time.monotonic()))
        if "answer" not in box:
            ended = "the agent ended without answering"
            raise Unreachable(
                f"{self.endpoint.label}: " + (f"no answer within {limit:g}s" if worker.is_alive() else ended)
            )
        self.answered += 1
        return classify(self.endpoint, json.loads(box["answer"]))

    def close(self) -> None:
        """Release what this session locked (and a root it created for a push that never installed)."""
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
