"""Contract 2 and 3: the queue directory, atomic files, state.json and the append-only events.jsonl."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from runner.state import Problem, check_manifest, check_state
from runner.vocab import EVENT_NAMES

STATES = ("queue", "running", "done", "failed")
HEARTBEAT_FILE = "heartbeat.json"  # the runner's heartbeat, every tick; status.json only when it changed


def fresh_status(root: str | os.PathLike[str], status: Any) -> Any:
    """STATUS (status.json as read) with the newer heartbeat of the same runner life from heartbeat.json laid
    over it: its heartbeat, tick and running jobs' elapsed times. Every reader of status.json reads it through
    this; status.json of a runner older than heartbeat.json (none there, or another life's) is left as it is."""
    if not isinstance(status, dict) or not isinstance(status.get("runner"), dict):
        return status
    try:
        beat = read_json(Path(root) / HEARTBEAT_FILE)
        runner = status["runner"]
        if beat.get("instance") != runner.get("instance") or "instance" not in beat:
            return status
        ahead = float(beat["heartbeat"]) - float(runner.get("heartbeat") or 0)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return status
    if ahead <= 0:
        return status
    runner.update(heartbeat=beat["heartbeat"], heartbeat_ts=beat.get("heartbeat_ts"), tick=beat.get("tick"))
    for run in status.get("running") or []:
        if isinstance(run, dict) and isinstance(run.get("elapsed_s"), (int, float)):
            run["elapsed_s"] = round(run["elapsed_s"] + ahead, 1)
    return status


PENDING_EVENTS_MAX = 10000


def atomic_write(path: Path, data: bytes | Sequence[bytes], durable: bool = True) -> None:
    """Write DATA (or its parts, one after the other) to PATH so a reader sees the old file or the new one, never
    a part. DURABLE: synced to disk, file and directory, before this returns; a cache, which a crash may lose
    (costing time, not correctness), is written without the two syncs."""
    fd, tmp = _temp(path)
    try:
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
        _fsync_dir(path.parent)


def _temp(path: Path) -> tuple[int, str]:
    """A new dot-file beside PATH, opened for writing (as tempfile.mkstemp makes it, without importing it)."""
    while True:
        tmp = str(path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), tmp
        except FileExistsError:
            continue


def _fsync_dir(path: Path) -> None:
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
    the queue or as events.jsonl would hold a plain open() until someone writes to it, and a probe with it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
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


def read_regular(path: str) -> bytes | None:
    """The bytes of PATH if it is (still) a regular file; None otherwise. Never blocks on a FIFO."""
    try:
        fd = _regular_fd(path)
    except OSError:
        return None
    try:
        return drain(fd, 1 << 20)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    """PATH's JSON, None when it does not exist; ValueError when it is not JSON or not a regular file."""
    data = read_regular(str(path))
    if data is None:
        if not os.path.lexists(path):
            return None
        raise ValueError("not a regular file")
    return json.loads(data)


def read_json_or_none(path: str | os.PathLike[str]) -> Any:
    """PATH's JSON; None when it is missing, unreadable, not JSON or not a regular file."""
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None


def timestamp(now: float) -> str:
    """The seed's event time format: local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))


class Queue:
    """One queue root: the directories are the states, a rename is a transition."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.logs = self.root / "logs"
        self.events_path = self.root / "events.jsonl"
        self.state_path = self.root / "state.json"
        self.status_path = self.root / "status.json"
        self.heartbeat_path = self.root / HEARTBEAT_FILE
        self.manifest_path = self.root / "manifest.json"
        self._events_fd: int | None = None
        self._pending: list[bytes] = []  # events not yet written (a full disk): written first next time
        self.events_error = ""
        self.last_written = 0.0  # when the last event was emitted (the heartbeat event is due after a silence)
        # Inside `synced_after()`: the directories renamed into and whether events.jsonl was written, fsynced
        # when it ends. None: each move and event is fsynced at once.
        self._unsynced: set[Path] | None = None
        self._events_unsynced = False

    def dir(self, state: str) -> Path:
        return self.root / state

    def state_stamp(self) -> tuple[int, ...]:
        """The mtimes of the state directories: changes whenever a job file comes to or leaves one of them."""
        stamp = []
        for state in STATES:
            try:
                stamp.append(os.stat(self.root / state).st_mtime_ns)
            except OSError:
                stamp.append(0)
        return tuple(stamp)

    def ensure(self) -> None:
        for name in (*STATES, "logs"):
            (self.root / name).mkdir(parents=True, exist_ok=True)

    def jobs(self, state: str) -> list[str]:
        """File names in STATE in priority (name) order; dot-files and temp files are skipped."""
        try:
            names = os.listdir(self.dir(state))
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.startswith(".") and n.endswith(".job"))

    def list_all(self, state: str) -> list[str]:
        """Every non-dot entry in STATE, .job or not (so strays can be reported)."""
        try:
            return sorted(n for n in os.listdir(self.dir(state)) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def move(self, filename: str, src: str, dst: str) -> bool:
        """Rename FILENAME from SRC to DST; False when it is no longer in SRC (someone moved or removed it)."""
        try:
            os.replace(self.dir(src) / filename, self.dir(dst) / filename)
        except FileNotFoundError:
            return False
        if self._unsynced is None:
            _fsync_dir(self.dir(dst))
        else:
            self._unsynced.add(self.dir(dst))
        return True

    @contextmanager
    def synced_after(self) -> Iterator[None]:
        """Moves and events inside it reach the disk (fsync) when it ends, not one by one: a tick's fsyncs
        (0.2-4 ms each) then come after the jobs it starts, not between a job's end and its lane's next start.
        Only a machine crash can tell the difference (a process that dies, the runner killed with -9 included,
        loses nothing written), and it would find the queue as it was a moment earlier."""
        outer = self._unsynced is not None
        if self._unsynced is None:
            self._unsynced = set()
        try:
            yield
        finally:
            if not outer:
                self.sync()

    def sync(self) -> None:
        """fsync what `synced_after` held back; moves and events are fsynced at once again from here on."""
        dirs, self._unsynced = self._unsynced or set(), None
        for path in sorted(dirs):
            _fsync_dir(path)
        if self._events_unsynced and self._events_fd is not None:
            try:
                os.fsync(self._events_fd)
            except OSError as exc:
                self.events_error = f"cannot append to {self.events_path.name}: {exc.strerror or exc}"
        self._events_unsynced = False

    def reopen_if_rotated(self) -> None:
        """events.jsonl moved or deleted under us (log rotation): start a new file instead of writing to the old."""
        if self._events_fd is None:
            return
        try:
            same = os.stat(self.events_path).st_ino == os.fstat(self._events_fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            self.close()

    def log_path(self, job: str) -> Path:
        return self.logs / f"{job}.log"

    def emit(self, now: float, job: str, event: str, **details: Any) -> dict[str, Any]:
        """Append one event (contract 3) and flush it to disk before returning.

        A write that fails (disk full) keeps the line to write first next time, so an event is late, never lost
        or torn into the next one; `write_error` says why until a write succeeds again."""
        if event not in EVENT_NAMES:
            raise ValueError(f"unknown event {event!r}")
        record = {"ts": timestamp(now), "job": job, "event": str(event), **details}
        self._pending.append((json.dumps(record) + "\n").encode())
        self.last_written = now
        del self._pending[:-PENDING_EVENTS_MAX]
        try:
            self._flush_events()
        except OSError as exc:
            self.events_error = f"cannot append to {self.events_path.name}: {exc.strerror or exc}"
            self.close()  # reopened (and its last line checked) at the next try
        return record

    def _flush_events(self) -> None:
        if self._events_fd is None:
            fd = os.open(self.events_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                # A torn last line (a crash of another writer, a full disk) must not swallow our first event.
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    os.write(fd, b"\n")
            except OSError:
                os.close(fd)
                raise
            self._events_fd = fd
        while self._pending:
            line = self._pending[0]
            written = os.write(self._events_fd, line)
            if written < len(line):  # a short write on a full disk: end the torn line's chance to glue
                raise OSError(28, "No space left on device (short write)")
            self._pending.pop(0)
        if self._unsynced is None:
            os.fsync(self._events_fd)
        else:
            self._events_unsynced = True
        self.events_error = ""

    def close(self) -> None:
        if self._events_fd is not None:
            if self._events_unsynced:
                try:
                    os.fsync(self._events_fd)
                except OSError:
                    pass
                self._events_unsynced = False
            os.close(self._events_fd)
            self._events_fd = None

    def load_state(self) -> tuple[dict[str, Any], list[Problem]]:
        """state.json checked field by field (see runner.state), with what was wrong in it."""
        try:
            raw = read_json(self.state_path)
        except OSError as exc:
            return check_state(None)[0], [("(whole file)", f"unreadable ({exc.strerror}): started from empty state")]
        except ValueError as exc:
            return check_state(None)[0], [("(whole file)", f"not JSON ({exc}): started from empty state")]
        return check_state(raw)

    def save_state(self, state: dict[str, Any]) -> None:
        write_json(self.state_path, state)

    def read_manifest(self) -> tuple[dict[str, Any] | None, list[Problem]]:
        try:
            raw = read_json(self.manifest_path)
        except OSError as exc:
            return None, [("(whole file)", f"unreadable ({exc.strerror}): ignored")]
        except ValueError as exc:
            return None, [("(whole file)", f"not JSON ({exc}): ignored")]
        return check_manifest(raw)

    def exit_record(self, filename: str) -> Path:
        """Where a job's wrapper records its exit status, next to it in running/ (a dot-file: never a job)."""
        return self.dir("running") / f".{filename}.exit"
