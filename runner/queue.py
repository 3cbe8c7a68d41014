"""Contract 2 and 3: the queue directory, state.json and the append-only events.jsonl (its files written and
read by runner.files)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.files import ROOT_DIRS, fsync_dir, make_dir, make_dirs, open_file, read_json, read_json_pieces, write_json
from runner.state import JsonPieces, check_manifest, check_state, manifest_object
from runner.vocab import EVENT_NAMES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from runner.state import Problem

STATES = ("queue", "running", "done", "failed")
HEARTBEAT_FILE = "heartbeat.json"  # the runner's heartbeat, every tick; status.json only when it changed
# Every waiting job's entry, written by the sweep when one changed; status.json carries their summary (counts by
# reason and blocker, the oldest few, each lane's first few), so what `plan status` reads does not grow with them.
WAITING_FILE = "waiting.json"
# A push's install in progress: its renames, written before the first (runner.agent.delivery: finish_pending).
INSTALL_RECORD = ".install.json"


# What heartbeat.json carries of status.json, as of its tick (the runner writes status.json whole only on its
# sweep, every --tick): each replaces status.json's own.
FRESH_KEYS = (
    "lanes",
    "running",
    "parked",
    "parked_lanes",
    "gpu_unknown",
    "gpus",
    "counts",
    "waiting",
    "disk_full",
    "write_errors",
    "incidents",
    "delivery",
    "leaks",
)


# What status.json carries of waiting.json's entries that changed since it was written (runner.service.statusfile):
# read into `queued` by fresh_status, never passed on.
UNLISTED_KEYS = ("queued_set", "queued_gone")


def fresh_status(root: str | os.PathLike[str], status: Any, every: bool = False) -> Any:
    """STATUS (status.json as read) with its `queued` list, and the newer heartbeat of the same runner life from
    heartbeat.json laid over it: its heartbeat and tick, the lanes, running jobs and counts as of that tick, and
    the waiting jobs judged since status.json was written (`queued_set` replaces their entries, `queued_gone`
    drops those that left the queue or wait no more). `queued` is each lane's first waiting jobs (`queued_first`;
    the rest are counted and grouped in `waiting_count` and `waiting_groups`), or with EVERY every waiting job
    (waiting.json, with the entries status.json says changed since it was written: its own `queued_set` and
    `queued_gone`, where its `listed` names that list). Every reader of status.json reads it through this;
    status.json of a runner older than heartbeat.json (none there, or another life's) is left as it is, one older
    than waiting.json lists every waiting job itself, and a waiting.json newer than status.json's (a runner killed
    between the two writes) is read as it is, newer than any change either file could lay over it."""
    if not isinstance(status, dict) or not isinstance(status.get("runner"), dict):
        return status
    newer_list = False
    if "queued" not in status and "waiting_file" in status:
        if every:
            queued, newer_list = _listed(root, status)
        else:
            queued = status.get("queued_first")
        status = {k: v for k, v in status.items() if k not in UNLISTED_KEYS}
        status["queued"] = queued
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
    fresh = dict(status, runner=dict(runner, heartbeat=beat["heartbeat"], heartbeat_ts=beat.get("heartbeat_ts")))
    fresh["runner"]["tick"] = beat.get("tick")
    shown = beat.get("status")
    if isinstance(shown, dict):
        laid = dict(fresh)
        laid.update((key, shown[key]) for key in FRESH_KEYS if key in shown)
        for key in ("swept", "sweep"):  # how old the reasons are, and the pass in progress
            if key in beat:
                laid[key] = beat[key]
        from runner.readers import status_problem  # runner.readers reads files through runner.files, as this does

        # What the heartbeat brings is checked as status.json's readers check it (a heartbeat.json written by
        # hand changes nothing a reader reads); status.json's own list was checked by whoever read it.
        brought = {key: laid[key] for key in FRESH_KEYS if key in shown}
        if not status_problem({**brought, "queued": beat.get("queued_set") or []}):
            if not newer_list:
                laid["queued"] = _changed(status.get("queued"), beat.get("queued_set"), beat.get("queued_gone"))
            was = beat.get("queued_was")
            if isinstance(was, dict) and "waiting_groups" in status:  # its summary, moved on by the same entries
                from runner.views.waiting import patch

                summary = patch(
                    status["waiting_groups"],
                    status.get("waiting_count"),
                    beat.get("queued_set") or [],
                    beat.get("queued_gone") or [],
                    was,
                )
                if summary is not None:
                    laid["waiting_groups"], laid["waiting_count"] = summary
            return laid
    if "running" in status:  # a runner before the overlay: its running jobs' elapsed times move on by the lead
        fresh["running"] = [
            dict(run, elapsed_s=round(run["elapsed_s"] + ahead, 1))
            if isinstance(run, dict) and isinstance(run.get("elapsed_s"), (int, float))
            else run
            for run in status.get("running") or []
        ]
    return fresh


def _listed(root: str | os.PathLike[str], status: dict[str, Any]) -> tuple[Any, bool]:
    """Every waiting job: the waiting.json of STATUS's runner life with the entries STATUS says changed since it
    was written, where STATUS names that list (its `listed`; a runner before it names none and carries none); as
    it is where it is newer than the one STATUS names (True: nothing newer can be laid over it); STATUS's
    `queued_first` where there is none (or it is unreadable, or older)."""
    from runner.readers import status_problem

    try:
        listed = read_json(Path(root) / WAITING_FILE)
        if listed.get("instance") == status["runner"].get("instance") and not status_problem(listed):
            named = status.get("listed")
            if named is None or listed.get("listed") == named:
                changed, gone = status.get("queued_set"), status.get("queued_gone")
                if changed is None or status_problem({"queued": changed}):
                    return listed["queued"], False
                return _changed(listed["queued"], changed, gone), False
            if float(listed["listed"]) > float(named):
                return listed["queued"], True
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return status.get("queued_first"), False


def _changed(queued: Any, changed: Any, gone: Any) -> Any:
    """QUEUED (status.json's list) with the entries CHANGED since replaced (or added) and the jobs GONE dropped."""
    if not isinstance(queued, list) or not isinstance(changed, list) or not isinstance(gone, list):
        return queued
    if not changed and not gone:
        return queued
    new = {e["job"]: e for e in changed if isinstance(e, dict) and isinstance(e.get("job"), str)}
    drop = {job for job in gone if isinstance(job, str)}
    out = []
    for entry in queued:
        job = entry.get("job") if isinstance(entry, dict) else None
        if job in drop:
            continue
        out.append(new.pop(job, entry) if isinstance(job, str) else entry)
    out.extend(new.values())
    return out


PENDING_EVENTS_MAX = 10000


def pending_install(root: str) -> bool:
    """An install record is there: the queue may hold part of an install until it is finished."""
    return os.path.lexists(os.path.join(root, INSTALL_RECORD))


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
        self.waiting_path = self.root / WAITING_FILE
        self.manifest_path = self.root / "manifest.json"
        self._events_fd: int | None = None
        self._pending: list[bytes] = []  # events not yet written (a full disk): written first next time
        self.events_error = ""
        self.last_written = 0.0  # when the last event was emitted (the heartbeat event is due after a silence)
        self.emitted: dict[str, int] = {}  # events emitted by this process, by name (the metrics count them)
        self.moves: dict[str, int] = dict.fromkeys(STATES, 0)  # files this process moved into each state, less out
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
        """The root and its directories, each made with its mode exactly (runner.files: 0700, 2770 shared)."""
        if not self.root.is_dir():
            make_dirs(str(self.root))
        for name in ROOT_DIRS:
            make_dir(str(self.root / name))

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
        self.moves[src] = self.moves.get(src, 0) - 1
        self.moves[dst] = self.moves.get(dst, 0) + 1
        if self._unsynced is None:
            fsync_dir(self.dir(dst))
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
            fsync_dir(path)
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
        # `ts` as the seed wrote it (the box's local time, no zone); `t` the same instant in epoch seconds, which
        # any reader in any zone reads alike (contract 3).
        record = {"ts": timestamp(now), "job": job, "event": str(event), **details, "t": round(now, 3)}
        self.emitted[str(event)] = self.emitted.get(str(event), 0) + 1
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
            fd = open_file(str(self.events_path), os.O_RDWR | os.O_APPEND | os.O_CREAT)
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

    def read_manifest(self, compact: bool = False) -> tuple[dict[str, Any] | None, list[Problem]]:
        """manifest.json, checked; COMPACT: as the runner keeps it (runner.state.manifest_object), read a piece at
        a time and without each plan's own copy of its jobs' entries and producers (push reads them, the runner
        never does)."""
        try:
            if compact:
                raw = read_json_pieces(self.manifest_path, lambda f: JsonPieces(f, manifest_object, _plan_jobs).read())
            else:
                raw = read_json(self.manifest_path)
        except OSError as exc:
            return None, [("(whole file)", f"unreadable ({exc.strerror}): ignored")]
        except ValueError as exc:
            return None, [("(whole file)", f"not JSON ({exc}): ignored")]
        return check_manifest(raw)

    def exit_record(self, filename: str) -> Path:
        """Where a job's wrapper records its exit status, next to it in running/ (a dot-file: never a job)."""
        return self.dir("running") / f".{filename}.exit"


def _plan_jobs(path: tuple[Any, ...]) -> bool:
    """plans.<plan>.jobs and .producers in manifest.json: each plan's own copy of its jobs' entries."""
    return len(path) == 3 and path[0] == "plans" and path[2] in ("jobs", "producers")
