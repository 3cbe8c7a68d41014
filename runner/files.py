"""Atomic files (part of contract 2): written whole or not at all, read only when they are regular files, so a
reader never sees half a file and never waits on a FIFO left where a file should be."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from runner.trust import file_mode


def atomic_write(path: Path, data: bytes | Sequence[bytes], durable: bool = True, mode: int | None = None) -> None:
    """Write DATA (or its parts, one after the other) to PATH so a reader sees the old file or the new one, never
    a part. DURABLE: synced to disk, file and directory, before this returns; a cache, which a crash may lose
    (costing time, not correctness), is written without the two syncs. MODE: the file's mode (else 0600)."""
    fd, tmp = _temp(path)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            else:
                handle.writelines(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def _temp(path: Path) -> tuple[int, str]:
    """A new dot-file beside PATH, opened for writing (as tempfile.mkstemp makes it, without importing it), with
    its directory's file mode exactly (runner.trust: 0600, or 0660 in a shared root), whatever the umask."""
    mode = file_mode(str(path.parent))
    while True:
        tmp = str(path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp"))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)
        except OSError:
            os.close(fd)
            os.unlink(tmp)
            raise
        return fd, tmp


def write_all_durably(directory: str, files: Sequence[tuple[str, bytes]], mode: int = 0o600) -> None:
    """Write each (NAME, DATA) into DIRECTORY as a new file of MODE exactly (whatever the umask), then make them all
    durable with one barrier: a single syncfs() of DIRECTORY's file system where the C library has it (one
    journal commit, not one per file), else an fsync of each file after all are written. Nothing is renamed
    here: the caller moves them in after this."""
    for name, data in files:
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    if _syncfs(directory):
        return
    for name, _ in files:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _syncfs(directory: str) -> bool:
    """syncfs(2) of DIRECTORY's file system; False where there is none (not Linux, or it failed)."""
    try:
        import ctypes  # only a push's install pays for it

        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        return bool(call(fd) == 0)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: Path, value: Any) -> None:
    # Compact, so the C encoder does it: status.json of 10 000 queued jobs is rewritten every tick.
    atomic_write(path, (json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n").encode())


def drain(fd: int, size: int) -> bytes:
    """Everything left to read from FD, SIZE bytes a read."""
    chunks = []
    while chunk := os.read(fd, size):
        chunks.append(chunk)
    return b"".join(chunks)


def _regular_fd(path: str) -> int:
    """A descriptor reading PATH if it is a regular file; OSError otherwise. Opened without blocking: a FIFO in
    the queue or as events.jsonl would hold a plain open() until someone writes to it, and a probe with it;
    and never through a symlink (a job file or log pointing at another user's file is not read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str) -> BinaryIO:
    """PATH opened for reading if it is a regular file; OSError otherwise (see _regular_fd)."""
    return os.fdopen(_regular_fd(path), "rb")


def read_regular(path: str, limit: int | None = None) -> bytes | None:
    """The bytes of PATH if it is (still) a regular file; None otherwise. Never blocks on a FIFO. Past LIMIT
    bytes, OverflowError."""
    try:
        fd = _regular_fd(path)
    except OSError:
        return None
    try:
        if limit is not None and os.fstat(fd).st_size > limit:
            raise OverflowError(f"larger than {limit >> 20} MiB")
        return drain(fd, 1 << 20)
    except OSError:
        return None
    finally:
        os.close(fd)


JSON_MAX_BYTES = 256 << 20  # a state file larger than this is not one the runner wrote: corrupt, not read


def read_json(path: Path) -> Any:
    """PATH's JSON, None when it does not exist; ValueError when it is not JSON, not a regular file, larger
    than JSON_MAX_BYTES or nested too deep for the parser (a planted file must not crash every start)."""
    try:
        data = read_regular(str(path), JSON_MAX_BYTES)
    except OverflowError as exc:
        raise ValueError(str(exc)) from None
    if data is None:
        if not os.path.lexists(path):
            return None
        raise ValueError("not a regular file")
    return loads(data)


def loads(data: str | bytes) -> Any:
    """json.loads, with JSON nested deeper than the parser goes a ValueError like any other bad JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deep") from None


def read_json_or_none(path: str | os.PathLike[str]) -> Any:
    """PATH's JSON; None when it is missing, unreadable, not JSON or not a regular file."""
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None
