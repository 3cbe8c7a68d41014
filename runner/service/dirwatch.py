"""Which names in a few directories changed since last asked: inotify through ctypes, or None where there is none.

The runner uses it twice: the scan reads again only the queue/ files named here (not every file each tick), and
the serve loop wakes the moment a file lands in queue/ or control/. Where the kernel (or a limit) gives no
inotify, `DirWatch.open` returns None and the runner falls back to a full scan and a directory-mtime poll.
"""

from __future__ import annotations

import ctypes
import os
import struct

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# Every way a name in the directory can come, go or change (a file rewritten in place must be read again).
MASK = (
    IN_CREATE
    | IN_MOVED_TO
    | IN_CLOSE_WRITE
    | IN_MODIFY
    | IN_ATTRIB
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
# A file is complete (closed after writing, renamed in) or gone: worth a tick now. A bare IN_CREATE is not (the
# writer is about to fill it); a name created and never closed (a link, a FIFO) is looked at a moment later.
_WAKE = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB
_RESET = IN_Q_OVERFLOW | IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF  # what was seen can no longer be trusted
_HEADER = struct.Struct("iIII")


class DirWatch:
    """`drain()` -> {directory: names changed} since the last call; `lost` set when events may have been missed
    (an overflowed queue, a directory replaced): the caller then looks at everything once and calls `rewatch`."""

    def __init__(self, fd: int, libc: ctypes.CDLL, dirs: list[str]) -> None:
        self.fd = fd
        self._libc = libc
        self.dirs = dirs
        self._wd: dict[int, str] = {}
        self.lost = False
        self._changed: dict[str, set[str]] = {}  # read from the kernel, not yet handed out by drain()
        self.rewatch()

    @classmethod
    def open(cls, dirs: list[str]) -> DirWatch | None:
        try:
            # The process's own symbols (libc among them), as procs does: ctypes.util.find_library would import
            # subprocess and tempfile into a long-lived runner for one name.
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None  # no inotify, or the user's instance limit is reached: the caller polls
        watch = cls(fd, libc, dirs)
        if watch.lost:
            watch.close()
            return None
        return watch

    def rewatch(self) -> None:
        """(Re)add a watch on each directory; `lost` stays set while one cannot be watched."""
        self.lost = False
        self._wd = {}
        for path in self.dirs:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), MASK | IN_ONLYDIR)
            if wd < 0:
                self.lost = True
            else:
                self._wd[wd] = path

    def drain(self) -> dict[str, set[str]]:
        """Every name changed since the last drain, by directory."""
        self.read()
        changed, self._changed = self._changed, {}
        return changed

    def read(self) -> tuple[bool, bool]:
        """Take what the kernel has queued (kept for `drain`): (a file is complete or gone, a name was created)."""
        wake = created = False
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return wake, created
            except OSError:
                self.lost = True
                return True, created
            if not data:
                return wake, created
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset : offset + length].split(b"\0", 1)[0]
                offset += length
                if mask & _RESET:
                    self.lost = wake = True
                wake = wake or bool(mask & _WAKE)
                created = created or bool(mask & IN_CREATE)
                directory = self._wd.get(wd)
                if directory is not None and name:
                    self._changed.setdefault(directory, set()).add(os.fsdecode(name))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
