"""`plan render -o DIR`: the job files appear in DIR all at once, or DIR is left as it was."""
from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from plancompiler.render import RenderedJob

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where the kernel or libc lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def write_jobs(jobs: Sequence[RenderedJob], out_dir: Path) -> None:
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for job in jobs:
            with open(stage / job.filename, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(job.text)
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(stage, 0o755)
        if out_dir.exists() and _exchange(stage, out_dir):
            shutil.rmtree(stage)  # now holds the old files
            return
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.rename(out_dir, old)
            os.rename(stage, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
