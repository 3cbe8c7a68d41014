"""One agent process on a host over ssh answering requests line by line: a push's probe and install go through
one, so the push lock it takes is held from probe to install (it ends with the process)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from typing import IO, Any

from plancompiler.diagnostics import PlanError
from plancompiler.transport import (
    RUNNER_MISSING,
    Endpoint,
    RemoteFailed,
    agent_argv,
    check_exit,
    check_timeout,
    decode,
    limit_for,
    upload,
)


class Session:
    """One agent process answering requests line by line: what it locks stays locked until close()."""

    def __init__(self, endpoint: Endpoint, timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = limit_for(timeout, endpoint)
        self.answered = 0
        self._start()

    def _start(self) -> None:
        argv = agent_argv(self.endpoint, "session")
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise PlanError(f"{argv[0]} not found: {exc.strerror}") from exc
        self._buffer = b""
        self._eof = False
        self._too_large = False

    def ask(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        limit = self.timeout if timeout is None else check_timeout(timeout)
        started = time.monotonic()
        line = self._exchange(mode, request, limit)
        for _ in range(2):  # twice at most, as in call()
            if not (line is None and self.answered == 0 and self._exit_code() == RUNNER_MISSING):
                break
            self.close()
            upload(self.endpoint, limit)
            self._start()
            line = self._exchange(mode, request, limit)
        if self._too_large:
            self._kill()
            self.close()
            raise RemoteFailed(
                f"{self.endpoint.label}: the host's answer passed {self.endpoint.max_answer_bytes} bytes and was "
                "cut off (a host that answers without end, or a queue larger than max_answer_mb allows)"
            )
        if line is None:
            rc = self._exit_code()
            if rc is None:  # no answer in time: the host or the link hangs
                self._kill()
                rc = 124
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - 4096))  # its end says why; a host may have written gigabytes there
            err = self._stderr.read().decode(errors="replace")
            check_exit(self.endpoint, rc, "", err, time.monotonic() - started, limit)
            raise RemoteFailed(f"{self.endpoint.label}: the agent ended without answering: {err.strip()[-400:]}")
        self.answered += 1
        return decode(self.endpoint, line.decode(errors="replace"))

    def _kill(self) -> None:
        """ssh and all it started (a session of their own): a host streaming to it must not keep it alive."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            self.proc.kill()
        self.proc.wait()

    def _exit_code(self) -> int | None:
        """The agent's exit status once it has ended (its stdout closed), None while it still runs."""
        if self._eof:
            return self.proc.wait()
        return self.proc.poll()

    def _exchange(self, mode: str, request: dict[str, Any], limit: float) -> bytes | None:
        """Send one request; its answer line, or None when the process ended or LIMIT passed first."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps({**request, "mode": mode}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._eof = True
            return None
        deadline = time.monotonic() + limit
        fd = self.proc.stdout.fileno()
        # In parts, joined once the line is whole: its deadline holds however fast bytes come, and no more than
        # max_answer_bytes are kept (a host streaming without a newline is cut off, not read into memory).
        parts, size = [self._buffer], len(self._buffer)
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in parts[-1]:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self._buffer = b"".join(parts)
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._eof = True
                    self._buffer = b"".join(parts)
                    return None
                size += len(chunk)
                if size > self.endpoint.max_answer_bytes:
                    self._too_large = True
                    self._buffer = b""
                    return None
                parts.append(chunk)
        line, _, self._buffer = b"".join(parts).partition(b"\n")
        return line

    def close(self) -> None:
        """End the agent (it releases its locks as its stdin ends), at worst by killing it."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._stderr.close()
