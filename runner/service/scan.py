"""Reading queue/: only regular files, and only once complete (the settle rule); anything else is invalid.

Nothing in queue/ can block a tick: entries are lstat()ed first and opened O_NONBLOCK, then fstat()ed, so a
FIFO named x.job is never waited on. The settle rule (docs/runner.md, contract 1): a job file is taken when its
sha256 is the one manifest.json lists for it (a push), or when nothing has written to it for `--settle`:
its mtime is that old, or its size, mtime and inode stayed the same across scans that far apart.
"""

from __future__ import annotations

import os
import stat
import sys
from bisect import bisect_left, insort
from collections.abc import Callable

from runner import jobfile
from runner.conditions import Condition, compile_condition
from runner.config import Config
from runner.digest import sha256_hex
from runner.files import read_regular
from runner.queue import Queue, timestamp
from runner.records import Parsed, file_key
from runner.service.manifest import Manifest
from runner.service.reasons import Reasons
from runner.vocab import Event, Reason


def _is_job(name: str) -> bool:
    return name.endswith(".job") and not name.startswith(".")


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class Scanner:
    """`scan` lists queue/ and returns the settled, parsed jobs in name order; owns what it remembers of files."""

    def __init__(
        self, config: Config, queue: Queue, reasons: Reasons, manifest: Manifest, forget: Callable[[str], None]
    ) -> None:
        self.config = config
        self.root = str(config.root)
        self.queue = queue
        self.reasons = reasons
        self.manifest = manifest
        self.forget_job = forget  # drops everything the runner knows of a job file (it left queue/)
        self.parsed: dict[str, Parsed] = {}  # files parsed but not taken (invalid ones, where they stay)
        self.conditions: dict[str, Condition] = {}  # text -> compiled for this root, shared by the jobs that have it
        self.first_seen: dict[str, tuple[int, float]] = {}  # settle rule: key, first scan
        self.stuck: dict[str, str] = {}  # invalid entries that could not be moved to failed/
        self.settle_due: float | None = None  # when the next settling file may be taken
        self.listing: set[str] = set()  # job names in queue/ as last seen
        self.listed = False  # queue/ was listed once: from then on the names a watch reports are enough
        self.taken: dict[str, Parsed] = {}  # settled, valid jobs: what scan returns (in `queued`, by name)
        self.pending: set[str] = set()  # not taken yet (settling, stuck, a symlink): looked at every scan
        self.recheck: set[str] = set()  # forgotten by the runner: looked at once more
        self.generation = 0  # changes whenever the list scan returns does
        # What the dispatcher orders by, kept as jobs are taken and leave (a job's end is O(log n), not a re-sort
        # of every queued job: 98 ms a tick at 100,000): `queued`, TAKEN's items in name order, one list changed
        # in place (its identity says nothing; `generation` does); the queued jobs per lane; and (-PRIORITY, name)
        # of those whose PRIORITY header is not 0, in the order they start.
        self.queued: list[tuple[str, Parsed]] = []
        self.lanes: dict[str, int] = {}
        self.prioritised: list[tuple[int, str]] = []

    def forget(self, filename: str) -> None:
        self._drop(filename)
        for table in (self.parsed, self.first_seen, self.stuck):
            table.pop(filename, None)
        self.recheck.add(filename)  # it left queue/ (or should have): the next scan looks at it again
        self.generation += 1

    def scan(self, now: float, changed: set[str] | None = None) -> list[tuple[str, Parsed]]:
        """The settled, parsed jobs in name order. CHANGED: the names a directory watch saw change since the last
        scan (then only those, and files not yet taken, are looked at); None: every file in queue/ is."""
        self.settle_due = None
        gone: set[str] = set()
        full = changed is None or not self.listed
        if full:
            self.listed = True
            names = self._names()
            gone, self.listing = self.listing - names, names
            to_read = names  # (not changed below while it is read: a copy of 100,000 names was 4 MB)
        else:
            to_read = self.pending | self.recheck
            for name in changed or ():
                if _is_job(name):
                    name = sys.intern(name)
                    to_read.add(name)
                    self.listing.add(name)
        self.recheck = set()
        self.pending = set()
        queue_dir = str(self.queue.dir("queue")) + os.sep  # joined as strings: pathlib per file was a third of a tick
        for name in sorted(to_read):
            before = self.taken.get(name)
            parsed = self._read(now, name, queue_dir + name)
            if parsed is not None and isinstance(parsed.job, jobfile.Invalid):
                self._invalid(now, name, str(parsed.job))
                parsed = None
            if parsed is None:
                self._drop(name)
                if os.path.lexists(queue_dir + name):
                    self.pending.add(name)  # settling, stuck, or replaced meanwhile: looked at again next scan
                else:
                    gone.add(name)
            elif parsed is not before:
                self._take(name, parsed)
                self.parsed.pop(name, None)  # one table holds a job's record: 100 000 of them add up
        for name in gone:
            self.listing.discard(name)
            self._drop(name)
            for table in (self.parsed, self.first_seen, self.stuck):
                table.pop(name, None)
            self.pending.discard(name)
            self.reasons.drop(name)
        if gone:
            self.generation += 1
        if full:
            self.reasons.keep_only(self.listing)
        return self.queued

    def _take(self, name: str, parsed: Parsed) -> None:
        """NAME taken as PARSED, new or in place of what was: at its place in `queued` by bisection ((NAME,) sorts
        just before (NAME, anything): no Parsed is ever compared)."""
        before, self.taken[name] = self.taken.get(name), parsed
        at = bisect_left(self.queued, (name,))
        if before is None:
            self.queued.insert(at, (name, parsed))
        else:
            self.queued[at] = (name, parsed)
            self._left(name, before)
            self.reasons.retaken(name)
        job = parsed.job
        if isinstance(job, jobfile.JobFile):
            self.lanes[job.lane] = self.lanes.get(job.lane, 0) + 1
            if job.priority:
                insort(self.prioritised, (-job.priority, name))
        self.generation += 1

    def _drop(self, name: str) -> None:
        """NAME is no longer taken (gone, forgotten, or not a settled job any more)."""
        before = self.taken.pop(name, None)
        if before is None:
            return
        del self.queued[bisect_left(self.queued, (name,))]
        self._left(name, before)
        self.generation += 1

    def _left(self, name: str, before: Parsed) -> None:
        job = before.job
        if isinstance(job, jobfile.JobFile):
            left = self.lanes[job.lane] - 1
            if left:
                self.lanes[job.lane] = left
            else:
                del self.lanes[job.lane]
            if job.priority:
                del self.prioritised[bisect_left(self.prioritised, (-job.priority, name))]

    def _names(self) -> set[str]:
        try:
            # interned: the manifest's names are, and the runner's tables then share one string per job
            return {sys.intern(e.name) for e in os.scandir(self.queue.dir("queue")) if _is_job(e.name)}
        except FileNotFoundError:
            return set()

    def _read(self, now: float, filename: str, path: str) -> Parsed | None:
        """FILENAME parsed, once it is a settled regular file; None while it is not (or is gone, or is invalid
        for what it is rather than what it says: then it is reported here)."""
        try:
            st = os.lstat(path)
            problem = self._not_regular(path, st)
        except FileNotFoundError:
            return None
        except OSError as exc:
            problem = f"cannot stat it: {exc.strerror}"
        if problem:
            self._invalid(now, filename, problem)
            return None
        key = file_key(st)
        parsed = self.taken.get(filename) or self.parsed.get(filename)
        if parsed is None or parsed.key != key:
            data = read_regular(path)
            if data is None:
                return None  # gone or replaced since the lstat: the next scan sees what it is now
            if not self._settled(now, filename, key, st.st_mtime, data):
                return None
            parsed = self._parse(filename, key, data)
        return parsed

    def _not_regular(self, path: str, st: os.stat_result) -> str | None:
        """Why PATH may not be a job, or None. A symlink never is: a job is read without following one (O_NOFOLLOW),
        so no link can make the runner run a file it did not see put in queue/ (another user's, /etc/passwd)."""
        if stat.S_ISREG(st.st_mode):
            return None
        if not stat.S_ISLNK(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            return f"{kind}, not a regular file: never opened as a job"
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a symlink (to {target}): job files are never read through a symlink; put the file itself in queue/"

    def _settled(self, now: float, filename: str, key: int, mtime: float, data: bytes) -> bool:
        settle = self.config.settle_s
        seen = self.first_seen.get(filename)
        if seen is None or seen[0] != key:
            seen = self.first_seen[filename] = (key, now)
        if settle <= 0 or now - mtime >= settle or now - seen[1] >= settle:
            del self.first_seen[filename]  # settled: parsed from now on by its key (10 000 of these add up)
            return True
        want = self.manifest.sha(filename)
        if want and sha256_hex(data) == want:
            del self.first_seen[filename]
            return True  # pushed: the manifest says what the whole file is
        due = min(mtime + settle, seen[1] + settle)
        self.settle_due = due if self.settle_due is None else min(self.settle_due, due)
        self.reasons.set(
            now,
            filename,
            Reason.SETTLING.value,
            f"written {max(now - mtime, 0):.1f}s ago: taken once unchanged for {settle:g}s (at {timestamp(due)})",
        )
        return False

    def _parse(self, filename: str, key: int, data: bytes) -> Parsed:
        job = jobfile.parse(filename, data, self.config.lanes)
        parsed = Parsed(key, job)
        if isinstance(job, jobfile.JobFile):
            parsed.requires = self._condition(job.requires)
            parsed.done_if = self._condition(job.done_if)
            # bash reads the file itself (100 000 bodies need not stay); equal conditions share one string, and
            # the paths one string each with the conditions' and the manifest's (interned)
            parsed.job = job.header(parsed.requires, parsed.done_if, tuple(map(sys.intern, job.outputs)))
        else:
            self.parsed[filename] = parsed  # kept while it stays (not taken): not parsed again every scan
        return parsed

    def _condition(self, text: str | None) -> Condition | None:
        """TEXT compiled for this root, once for every queued job that has it (a chain's DONE_IF is the next
        job's REQUIRES)."""
        if text is None:
            return None
        cond = self.conditions.get(text)
        if cond is None:
            if len(self.conditions) >= 4096:
                self.conditions = {}  # the jobs keep theirs; a chain's next job is read next (name order)
            cond = self.conditions[text] = compile_condition(text, self.root, sys.intern)
        return cond

    def _invalid(self, now: float, filename: str, why: str) -> None:
        """Never executed: moved to failed/ with one `invalid` event; where it cannot be moved it stays,
        `blocked` with the reason in status.json, and the event is not repeated."""
        if filename not in self.stuck:
            try:
                moved = self.queue.move(filename, "queue", "failed")
            except OSError as exc:
                moved, why = False, f"{why}; cannot move it to failed/: {exc.strerror}"
            if moved or os.path.lexists(self.queue.dir("queue") / filename):
                self.queue.emit(now, filename, Event.INVALID.value, reason=why)
            if moved:
                # Kept as the job's last failure: the incident book groups invalid files by why (runner.alerts).
                self.reasons.state.failed(filename, timestamp(now), None, f"invalid job file: {why}")
                self.forget_job(filename)
                return
            self.stuck[filename] = why
        self.reasons.set(now, filename, Reason.BLOCKED.value, self.stuck[filename], filename)
