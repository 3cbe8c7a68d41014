"""Atomic files (part of contract 2): written whole or not at all, read only when they are regular files, so a
reader never sees half a file and never waits on a FIFO left where a file should be.

The box trusts no other user (sshd's StrictModes and cron are the models): a queue root, its directories and
the runner code cached in it must be ours or root's, writable by nobody else, and real directories, not
symlinks; what the runner and the agent create gets an explicit mode, whatever the umask.

Modes: directories 0700 and files 0600. A lab that shares a root with a group says so on the directory itself:
setgid and group-writable (`chmod 2770 ROOT`; `runner run --group-share` creates it so), and then directories
are 2770 and files 0660. Nothing is ever world-writable."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from runner.errors import Untrusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO


def not_replaceable(path: str | Path) -> str | None:
    """Why PATH, named by a user for a file we rewrite by renaming a new one onto it (`plan watch --state`,
    `runner run --metrics`), must not be: it is there and not a regular file (a device, a FIFO, a directory, a
    link), which the rename would replace (`--state /dev/null` left a machine a /dev/null that was a file)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None if stat.S_ISREG(mode) else f"{path}: not a regular file (it is rewritten whole, replacing it)"


def atomic_write(path: Path, data: bytes | Iterable[bytes], durable: bool = True, mode: int | None = None) -> None:
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
    its directory's file mode exactly (0600, or 0660 in a shared root: file_mode), whatever the umask."""
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
    here: the caller moves them in after this. Each NAME is opened in DIRECTORY's descriptor, not by its path:
    10 000 files in about 20 ms less."""
    where = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name, data in files:
            fd = open_in(where, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, directory)
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        if _syncfs(where):
            return
        for name, _ in files:
            fd = open_in(where, name, os.O_RDONLY, 0, directory)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        os.close(where)


def open_in(where: int, name: str, flags: int, mode: int, directory: str) -> int:
    """NAME opened in the directory whose descriptor is WHERE (DIRECTORY's path where dir_fd is not supported)."""
    if os.open in os.supports_dir_fd:
        return os.open(name, flags, mode, dir_fd=where)
    return os.open(os.path.join(directory, name), flags, mode)


def _syncfs(fd: int) -> bool:
    """syncfs(2) of the file system of the directory FD; False where there is none (not Linux, or it failed)."""
    try:
        import ctypes  # only a push's install pays for it

        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    return bool(call(fd) == 0)


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


_TABLE = "\0a table encoded once\0"  # stands for it while what holds it is encoded


def json_with(value: Any, holders: list[dict[str, Any]], table: str | None, sort_keys: bool = False) -> str:
    """json.dumps(VALUE), the "jobs" of each of HOLDERS written as TABLE, its JSON encoded once: a push's jobs
    table (10 000 jobs, 2 MB) is in its install record and twice in the manifest."""
    kept = [(holder, holder["jobs"]) for holder in holders]
    for holder, _ in kept:
        holder["jobs"] = _TABLE
    try:
        text = json.dumps(value, sort_keys=sort_keys)
    finally:
        for holder, jobs in kept:
            holder["jobs"] = jobs
    marker = json.dumps(_TABLE)
    if table is None or text.count(marker) != len(holders):  # the marker's text sent in a value: encoded whole
        return json.dumps(value, sort_keys=sort_keys)
    return text.replace(marker, table)


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


def read_json(path: Path, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
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
    return loads(data, object_hook)


def read_json_pieces(path: Path, read: Callable[[BinaryIO], Any]) -> Any:
    """PATH's JSON as READ makes it from the open file, a piece at a time (runner.state.JsonPieces), with
    read_json's checks: None when it does not exist, ValueError when it is not a regular file or too large."""
    try:
        fd = _regular_fd(str(path))
    except OSError:
        if not os.path.lexists(path):
            return None
        raise ValueError("not a regular file") from None
    with os.fdopen(fd, "rb") as handle:
        if os.fstat(fd).st_size > JSON_MAX_BYTES:
            raise ValueError(f"larger than {JSON_MAX_BYTES >> 20} MiB")
        return read(handle)


def loads(data: str | bytes, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """json.loads, with JSON nested deeper than the parser goes a ValueError like any other bad JSON."""
    try:
        return json.loads(data, object_hook=object_hook)
    except RecursionError:
        raise ValueError("nested too deep") from None


def read_json_or_none(path: str | os.PathLike[str]) -> Any:
    """PATH's JSON; None when it is missing, unreadable, not JSON or not a regular file."""
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None


# The directories under a root that hold what runs (queue/, control/, running/), what it writes (logs/, stamps/)
# and the code a `plan` call imports (.plan-runner/).
CHECKED_DIRS = ("queue", "running", "done", "failed", "logs", "control", "stamps", ".plan-runner")
ROOT_DIRS = ("queue", "running", "done", "failed", "logs", "control")  # made by the runner, the push and bootstrap
DIR_MODE = 0o700
FILE_MODE = 0o600
SHARED_DIR_MODE = 0o2770
SHARED_FILE_MODE = 0o660
MODES_HELP = (
    "Modes: directories it creates are 0700 and files 0600 whatever the umask; --group-share makes them "
    "2770 and 0660 (setgid, group-writable: a lab's shared root). It refuses to run on a root, queue/, "
    "control/, running/, logs/ or .plan-runner/ that another user (root excepted) owns, that is "
    "world-writable, group-writable without setgid, or a symlink; logs, job, control and state files are "
    "opened without following symlinks."
)


def shared(mode: int) -> bool:
    """A directory a group shares on purpose: setgid and group-writable (the lab's `chmod 2770`)."""
    return bool(mode & stat.S_ISGID) and bool(mode & 0o020)


def dir_mode(parent: str) -> int:
    """The mode for a new directory in PARENT: shared if PARENT is."""
    try:
        return SHARED_DIR_MODE if shared(os.stat(parent).st_mode) else DIR_MODE
    except OSError:
        return DIR_MODE


def file_mode(parent: str) -> int:
    """The mode for a new file in PARENT: group-readable and -writable if PARENT is shared, else 0600."""
    try:
        return SHARED_FILE_MODE if shared(os.stat(parent).st_mode) else FILE_MODE
    except OSError:
        return FILE_MODE


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def dir_problem(path: str, me: int | None = None) -> str | None:
    """Why PATH (a directory of a queue root) cannot be trusted; None when it can, or does not exist."""
    me = os.geteuid() if me is None else me
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot check it: {exc.strerror}"
    mode = stat.S_IMODE(st.st_mode)
    said = f"{path} (owner {_owner(st.st_uid)}, mode {mode:04o})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{said} is a symlink to {target}: fix: replace it with a real directory (mv; mkdir -m 700)"
    if not stat.S_ISDIR(st.st_mode):
        return f"{said} is not a directory: fix: move it away"
    if st.st_uid not in (me, 0):
        return (
            f"{said} belongs to another user, who could put jobs there that run as {_owner(me)}: "
            f"fix: remove it, or chown -R {me} {path} after checking what it holds"
        )
    if mode & 0o002:
        return f"{said} is world-writable: anyone could put a job there: fix: chmod 700 {path}"
    if mode & 0o020 and not shared(mode):
        return (
            f"{said} is group-writable: fix: chmod 700 {path} (or chmod 2770 {path} to share it with its "
            "group on purpose: --group-share)"
        )
    return None


def parent_problem(path: str, me: int | None = None) -> str | None:
    """Why a directory above PATH could let another user replace it (as sshd checks a home's parents)."""
    me = os.geteuid() if me is None else me
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            st = os.stat(parent)
        except OSError:
            st = None
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
            sticky = bool(mode & stat.S_ISVTX)  # /tmp: others may not rename what is ours
            said = f"{parent} (owner {_owner(st.st_uid)}, mode {mode:04o})"
            if st.st_uid not in (me, 0) and not sticky:
                return f"{said}, above {path}, belongs to another user, who could replace {path}: fix: move the root"
            if mode & 0o002 and not sticky:
                return f"{said}, above {path}, is world-writable: fix: chmod o-w {parent} or move the root"
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


def root_problems(root: str, names: Iterable[str] = CHECKED_DIRS) -> list[str]:
    """Everything wrong with ROOT, the directories above it and its NAMES: empty when it can be trusted. ROOT
    itself may be a symlink of ours (or root's); the directory it names is then the one checked."""
    me = os.geteuid()
    try:
        st = os.lstat(root)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode) and st.st_uid not in (me, 0):
        return [f"{root} is a symlink owned by {_owner(st.st_uid)}, who can point it anywhere: fix: remove it"]
    real = os.path.realpath(root)
    found = [p for p in (dir_problem(real, me), parent_problem(real, me)) if p]
    if found:
        return found  # what lies under a root another user controls says nothing more
    return [p for p in (dir_problem(os.path.join(real, name), me) for name in names) if p]


def check_root(root: str, names: Iterable[str] = CHECKED_DIRS) -> None:
    """Untrusted naming every problem of ROOT (see `root_problems`)."""
    found = root_problems(root, names)
    if found:
        raise Untrusted("refusing the queue root " + root + ": " + "; ".join(found))


def make_dir(path: str, mode: int | None = None) -> None:
    """PATH created with MODE exactly (the umask does not apply); its parent's sharing when MODE is None.
    An existing PATH is left as it is (checked by `check_root`)."""
    mode = dir_mode(os.path.dirname(os.path.abspath(path))) if mode is None else mode
    try:
        os.mkdir(path, mode & 0o777)
    except FileExistsError:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def make_dirs(path: str, mode: int | None = None) -> None:
    """PATH and any missing directories above it: those above 0755 (they hold nothing of ours), PATH as
    `make_dir` makes it. Each level is made with its mode exactly."""
    path = os.path.abspath(path)
    missing = []
    at = path
    while not os.path.lexists(at):
        missing.append(at)
        up = os.path.dirname(at)
        if up == at:
            break
        at = up
    for level in reversed(missing):
        make_dir(level, mode if level == path else 0o755)


def open_file(path: str, flags: int, parent: str | None = None) -> int:
    """A descriptor on PATH, never through a symlink (O_NOFOLLOW); a file it creates gets its directory's file
    mode exactly, whatever the umask, and a file that is not regular is refused (OSError). Opened without
    blocking, so a FIFO planted there is refused rather than waited on (a regular file reads as ever)."""
    import errno

    mode = file_mode(parent or os.path.dirname(path))
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if flags & os.O_CREAT and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
        os.set_blocking(fd, True)  # a job's log is its stdout: no O_NONBLOCK surprise for what it runs
    except BaseException:
        os.close(fd)
        raise
    return fd
