"""`plan render -o DIR`: the job files appear in DIR all at once, or DIR is left as it was."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
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


class WriteRefused(OSError):
    """DIR is something `plan render` must not replace: a file, or a directory holding more than job files."""

    def __str__(self) -> str:
        return str(self.args[0])


def _check_replaceable(out_dir: Path) -> None:
    """Refuse, before anything is created, to replace what is not a directory of job files."""
    try:
        info = os.stat(out_dir)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise WriteRefused(
            "it exists and is not a directory; nothing written (-o names a directory "
            "that will hold only this plan's job files)"
        )
    try:
        cwd: Path | None = Path(os.path.realpath(Path.cwd()))
    except OSError:
        cwd = None
    if cwd is not None and (out_dir == cwd or out_dir in cwd.parents):
        raise WriteRefused(
            "it is the working directory or holds it; nothing written (give -o a directory of its own, e.g. -o jobs)"
        )
    others = []
    with os.scandir(out_dir) as entries:
        for entry in entries:
            if not (entry.name.endswith(".job") and entry.is_file(follow_symlinks=False)):
                others.append(entry.name)
    if others:
        listed = ", ".join(repr(n) for n in sorted(others)[:5]) + (", ..." if len(others) > 5 else "")
        raise WriteRefused(
            f"it holds {len(others)} entr{'y' if len(others) == 1 else 'ies'} that "
            f"{'is' if len(others) == 1 else 'are'} not a job file ({listed}); it would be "
            "replaced as a whole, so nothing written (give -o a directory of its own)"
        )


def write_jobs(jobs: Sequence[RenderedJob], out_dir: Path) -> None:
    """Replace OUT_DIR with exactly these job files; WriteRefused (nothing changed) where that would lose data."""
    out_dir = Path(os.path.realpath(out_dir))
    _check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for job in jobs:
            with open(stage / job.filename, "w", encoding="utf-8", newline="\n") as handle:
                handle.write(job.text)
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(stage, 0o755)
        if out_dir.is_dir() and _exchange(stage, out_dir):
            shutil.rmtree(stage)  # now holds the old files
            return
        if out_dir.is_dir():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.rename(out_dir, old)
            os.rename(stage, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
