"""`plan` run inside the test's own process, as its script runs it, for tests that are not about the process.

A `python -m plancompiler.cli` child costs ~0.25 s of imports; `cli.main` here is the same code path (the
light reader, then typer, the same exit codes) with stdout and stderr kept apart as a process's are. The
process boundary itself (the entry point, no traceback, --debug, the hooks) keeps real-process tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # not from conftest: the limited child imports this module alone


@dataclass(frozen=True)
class Ran:
    """What a `plan` run ended with, named as subprocess.CompletedProcess names it."""

    returncode: int
    stdout: str
    stderr: str


def _stream(errors: str) -> io.TextIOWrapper:
    # What a child's pipes are: UTF-8 text over bytes (some commands write the bytes), never a terminal.
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline="\n", write_through=True)


@contextlib.contextmanager
def _inside(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    before_cwd, before_env = os.getcwd(), {k: os.environ.get(k) for k in env}
    os.chdir(cwd)
    os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(before_cwd)
        for key, value in before_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def plan_main(*args: str, cwd: Path, cache: Path) -> Ran:
    """`plan ARGS...` run by cli.main in CWD with its own shellcheck cache: (exit code, stdout, stderr)."""
    from plancompiler import cli

    out, err = _stream("strict"), _stream("backslashreplace")
    with _inside(cwd, {"PLAN_CACHE_DIR": str(cache)}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return Ran(code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())  # type: ignore[attr-defined]


@contextlib.contextmanager
def unblocking(fifo: Path, after: float = 30.0) -> Iterator[None]:
    """Whatever reads FIFO inside this block gets end-of-file after AFTER seconds: a hang becomes a failure
    (the block ends, its assertions see what was read) instead of a test that never ends."""
    done = threading.Event()

    def open_and_close() -> None:
        if done.wait(after):
            return
        with contextlib.suppress(OSError):  # ENXIO: nobody has it open for reading, so nothing waits on it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    watchdog = threading.Thread(target=open_and_close, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


_LIMITED = """
import json, sys
from pathlib import Path
from tests.inprocess import plan_main
runs = json.loads(sys.stdin.read())
print(json.dumps([plan_main(*args, cwd=Path(cwd), cache=Path(cache)).__dict__ for cwd, cache, args in runs]))
"""


def plan_limited(runs: list[tuple[Path, list[str]]], limit: int, timeout: float = 120) -> list[Ran]:
    """Each (CWD, ARGS) of RUNS as `plan ARGS` in CWD, all in one child process whose address space is LIMIT
    bytes: a value built before it is bounded fails there (a MemoryError, exit 2), not on the machine."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    given = [(str(cwd), str(cwd / "cache"), args) for cwd, args in runs]
    child = subprocess.run(
        [sys.executable, "-c", _LIMITED],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
        preexec_fn=limited,  # before Python starts: the interpreter itself runs under the limit
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return [Ran(**one) for one in json.loads(child.stdout)]
