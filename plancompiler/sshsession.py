"""One agent process on a host over ssh answering requests line by line: a push's probe and install go through
one, so the push lock it takes is held from probe to install (it ends with the process).

A request goes as runner/agent/wire.py writes it: a push's bundle of job files as one compressed frame. Sending,
the answer and the agent's stderr share one deadline and their caps: an answer line at most max_answer_bytes, and
stderr at most as much over the session, of which only the last 4 KiB are kept (it says why the agent ended)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import Any

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
from runner.agent import wire

ERR_KEPT = 4096  # bytes of the agent's stderr kept: the end of it, which says why it ended
CLOSE_WAIT_S = 10.0


class Session:
    """One agent process answering requests line by line: what it locks stays locked until close()."""

    def __init__(self, endpoint: Endpoint, timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = limit_for(timeout, endpoint)
        self.answered = 0
        self._start()

    def _start(self) -> None:
        argv = agent_argv(self.endpoint, "session")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise PlanError(f"{argv[0]} not found: {exc.strerror}") from exc
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # a request is sent under the deadline, in parts
        self._buffer = b""
        self._eof = False
        self._too_large = ""  # which of the host's outputs passed its cap
        self._err_tail = b""
        self._err_size = 0
        self._err_eof = False

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
            what = self._too_large
            self._kill()
            self.close()
            raise RemoteFailed(
                f"{self.endpoint.label}: the host's {what} passed {self.endpoint.max_answer_bytes} bytes and was "
                "cut off (a host that answers without end, or a queue larger than max_answer_mb allows)"
            )
        if line is None:
            rc = self._exit_code()
            if rc is None:  # no answer in time: the host or the link hangs
                self._kill()
                rc = 124
            err = self._err_tail.decode(errors="replace")  # its end says why; a host may have written far more
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
            try:
                return self.proc.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:  # its stdout closed, yet it runs on: a hang like any other
                return None
        return self.proc.poll()

    def _read_err(self, fd: int) -> bool:
        """One read of the agent's stderr into the kept tail; False at its end or past its cap."""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self._err_eof = True
            return False
        self._err_size += len(chunk)
        self._err_tail = (self._err_tail + chunk)[-ERR_KEPT:]
        if self._err_size > self.endpoint.max_answer_bytes:
            self._too_large = "error output"
            return False
        return True

    def _exchange(self, mode: str, request: dict[str, Any], limit: float) -> bytes | None:
        """Send one request; its answer line, or None when the process ended or LIMIT passed first."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        pending = memoryview(wire.encode({**request, "mode": mode}))
        in_fd, out_fd, err_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno()
        deadline = time.monotonic() + limit
        # In parts, joined once the line is whole: its deadline holds however fast bytes come, and no more than
        # max_answer_bytes are kept (a host streaming without a newline is cut off, not read into memory).
        parts, size = [self._buffer], len(self._buffer)
        with selectors.DefaultSelector() as selector:
            selector.register(in_fd, selectors.EVENT_WRITE)
            selector.register(out_fd, selectors.EVENT_READ)
            if not self._err_eof:
                selector.register(err_fd, selectors.EVENT_READ)
            while b"\n" not in parts[-1]:
                if self._eof and (self._err_eof or err_fd not in selector.get_map()):
                    break  # ended: what it said on stderr is read to its end
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in selector.select(left):
                    if key.fd == in_fd:
                        try:
                            pending = pending[os.write(in_fd, pending[: 1 << 16]) :]
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # it ended: its stdout's end and its stderr say why
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(in_fd)
                    elif key.fd == err_fd:
                        if not self._read_err(err_fd):
                            selector.unregister(err_fd)
                            if self._too_large:
                                self._buffer = b""
                                return None
                    else:
                        chunk = os.read(out_fd, 1 << 16)
                        if not chunk:
                            self._eof = True
                            selector.unregister(out_fd)
                            continue
                        size += len(chunk)
                        if size > self.endpoint.max_answer_bytes:
                            self._too_large = "answer"
                            self._buffer = b""
                            return None
                        parts.append(chunk)
            if b"\n" not in parts[-1]:
                self._buffer = b"".join(parts)
                return None
        if pending:  # answered before the whole request went: the agent would read the rest as a request cut short
            self._close_stdin()
        line, _, self._buffer = b"".join(parts).partition(b"\n")
        return line

    def _close_stdin(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        """End the agent (it releases its locks as its stdin ends), at worst by killing it; its output is read
        (and dropped) meanwhile, so a host writing to it cannot hold it up."""
        if self.proc.poll() is None:
            self._close_stdin()
            self._drain(time.monotonic() + CLOSE_WAIT_S)
            try:
                self.proc.wait(timeout=max(0.1, CLOSE_WAIT_S / 10))
            except subprocess.TimeoutExpired:
                self._kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def _drain(self, deadline: float) -> None:
        """Read stdout and stderr to their ends (or DEADLINE), keeping nothing."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        with selectors.DefaultSelector() as selector:
            for stream in (self.proc.stdout, self.proc.stderr):
                if not stream.closed:
                    selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for key, _ in selector.select(left):
                    if not os.read(key.fd, 1 << 16):
                        selector.unregister(key.fd)
