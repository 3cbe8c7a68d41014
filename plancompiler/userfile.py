"""A user's file (a plan, a hosts file) read safely: a regular file only, never more than a limit, never
blocking on a FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class Unreadable(Exception):
    """A file that is not read at all: not a regular file (a FIFO, a device), or larger than the limit."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_limited(path: Path, limit: int, what: str = "plan") -> bytes:
    """The bytes of the regular file PATH, at most LIMIT of them; Unreadable or OSError otherwise.

    Opened without blocking (a FIFO would wait for a writer forever) and checked on the open
    descriptor, so what is read is what was checked; never more than LIMIT + 1 bytes are read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise Unreadable(f"{kind}, not a {what} file")
        too_large = f"the {what} file is larger than {limit:,} bytes (raise the limit with plan --max-size)"
        if info.st_size > limit:
            raise Unreadable(too_large)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unreadable(too_large)  # it grew after the check
        return b"".join(chunks)
    finally:
        os.close(fd)
