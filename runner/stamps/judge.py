"""Rerun on change, the runner's side: whether a queued plan job whose DONE_IF holds is really done (its stamp)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from runner import jobfile
from runner.records import Frozen, fill
from runner.stamps import (
    STAMPS_DIR,
    current_ids,
    file_hash,
    new_stamp,
    producers_of,
    queued_path,
    ran_again,
    read,
    rerun_never,
    stamp_name,
    stamped,
    try_write,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from runner.state import Problem

# What a verdict reads beyond the job's own file: the manifest and these directories (a job file coming or
# going, a stamp written: each is a rename, so its directory's mtime changes).
WORLD_DIRS = ("queue", "running", "failed", "done", STAMPS_DIR)
# A directory changed this recently may change again within its mtime's granularity (a second on some
# filesystems) unseen: verdicts are kept only once every one of them has been still for this long.
STILL_S = 1.0


class Verdict(Frozen):
    """What a queued job's stamp says once its DONE_IF holds: done (skip it), stale (run it) or wait (a frozen
    record: runner.records)."""

    __slots__ = ("stale", "wait", "why", "blocker", "file", "problems")
    stale: bool
    wait: bool  # stale, but a producer must run again first
    why: str
    blocker: str
    file: str  # the stamp file, for problems
    problems: list[Problem]

    def __init__(
        self,
        stale: bool = False,
        wait: bool = False,
        why: str = "",
        blocker: str = "",
        file: str = "",
        problems: list[Problem] | None = None,
    ) -> None:
        fill(self, "stale", stale)
        fill(self, "wait", wait)
        fill(self, "why", why)
        fill(self, "blocker", blocker)
        fill(self, "file", file)
        fill(self, "problems", [] if problems is None else problems)


FINE = Verdict()  # nothing stale, nothing wrong (its `file` is not said: stamp_name(filename) is)


def judge(
    root: str, filename: str, job: jobfile.JobFile, manifest: Mapping[str, Any] | None, now: float, done: bool
) -> Verdict:
    """Whether queued FILENAME, whose DONE_IF holds (DONE), is really done. Without a usable stamp the old rule
    holds and the stamp is adopted (so the next change reruns it); a torn stamp is named in `problems`. A job
    a push marked stale waits while a producer is to run again first, whether or not its DONE_IF holds (its
    REQUIRES may well hold on the producer's old output)."""
    name = stamp_name(filename)
    if not stamped(job):
        return Verdict(file=name)
    stamp, problems = read(root, filename)
    if rerun_never(manifest, filename):
        if done:
            problems = [*problems, *_release(root, filename, stamp)]
        return Verdict(file=name, problems=problems)
    marked = str(stamp.get("stale") or "") if stamp is not None else ""  # why a push marked it stale
    if not done and not marked:
        return Verdict(file=name, problems=problems)
    producers = producers_of(manifest, filename)
    blocker = _pending(root, producers) if stamp is not None else None
    if blocker is not None:
        failed = os.path.exists(os.path.join(root, "failed", blocker))
        why = f"waits for {blocker}{', which failed,' if failed else ''} to run again first"
        return Verdict(stale=True, wait=True, why=why, blocker=blocker, file=name, problems=problems)
    if not done:
        return Verdict(stale=True, why=f"marked stale by a push: {marked}", file=name, problems=problems)
    return _against_stamp(root, filename, stamp, producers, now, problems)


def _release(root: str, filename: str, stamp: dict[str, Any] | None) -> list[Problem]:
    """A job marked stale before it became `rerun: never`: its output stands, so its consumers must stop waiting
    on it (its stamp is made fresh)."""
    if stamp is None or not stamp.get("stale"):
        return []
    fresh = {k: v for k, v in stamp.items() if k != "stale"}
    return try_write(root, filename, {**fresh, "sha": file_hash(queued_path(root, filename))})


def _pending(root: str, producers: Sequence[str]) -> str | None:
    """The first producer that is to run again: queued, running, or its stamp marked stale."""
    for producer in producers:
        if any(os.path.exists(os.path.join(root, state, producer)) for state in ("queue", "running")):
            return producer
        theirs, _ = read(root, producer)
        if theirs and theirs.get("stale"):
            return producer
    return None


def _against_stamp(
    root: str,
    filename: str,
    stamp: dict[str, Any] | None,
    producers: Sequence[str],
    now: float,
    problems: list[Problem],
) -> Verdict:
    """A job whose DONE_IF holds, its producers settled: done unless what it runs or a producer's run changed
    since its stamp (a job without one adopts one now)."""
    name = stamp_name(filename)
    sha = file_hash(queued_path(root, filename))
    if sha is None:
        return Verdict(file=name, problems=problems)  # gone meanwhile: the caller's move finds that out
    current = current_ids(root, producers)
    if stamp is None:
        problems = [*problems, *try_write(root, filename, new_stamp(filename, sha, current, now, run=False))]
        return Verdict(file=name, problems=problems)
    marked = str(stamp.get("stale") or "")
    if stamp["sha"] != sha:
        why = f"marked stale by a push: {marked}" if marked else "what it runs changed since it ran"
        return Verdict(stale=True, why=why, file=name, problems=problems)
    for producer in producers:
        if ran_again(stamp["producers"].get(producer), current[producer]):
            why = f"{producer} ran again since it ran"
            return Verdict(stale=True, why=why, blocker=producer, file=name, problems=problems)
    return Verdict(file=name, problems=problems)


class Verdicts:
    """Each stamped queued job's verdict, kept while nothing it was judged from changed: the job's file (its
    key) and whether its DONE_IF held, the manifest, and the queue's state directories and stamps/ (see
    WORLD_DIRS). A tick where none of them changed judges no job again; one where one did judges them all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._world: tuple[Any, ...] | None = None
        # file -> (its key, whether DONE_IF held, the verdict); most jobs' is FINE with DONE_IF false, kept as the
        # key alone (100 000 tuples of three add up)
        self._kept: dict[str, int | tuple[int, bool, Verdict]] = {}
        self.judged = 0  # verdicts worked out (not taken from what was kept): a test counts them

    def begin(self, manifest_key: object, clock: float) -> None:
        """A new tick: what was kept stays only if the world it was judged in is the same and has been still
        for STILL_S at CLOCK (the wall clock: directory mtimes are on it)."""
        mtimes = []
        for name in WORLD_DIRS:
            try:
                mtimes.append(os.stat(os.path.join(self.root, name)).st_mtime_ns)
            except OSError:
                mtimes.append(0)
        world = (manifest_key, *mtimes)
        if world != self._world or clock - max(mtimes) / 1e9 < STILL_S:
            self._kept.clear()
        self._world = world

    def judge(
        self,
        filename: str,
        key: int,
        job: jobfile.JobFile,
        manifest: Mapping[str, Any] | None,
        now: float,
        done: bool,
    ) -> Verdict:
        kept = self._kept.get(filename)
        if kept is not None:
            if isinstance(kept, int):
                if kept == key and not done:
                    return FINE
            elif kept[0] == key and kept[1] == done:
                return kept[2]
        self.judged += 1
        verdict = judge(self.root, filename, job, manifest, now, done)
        if not verdict.problems:  # a stamp that cannot be read or written is tried again every tick
            if not (verdict.stale or verdict.wait or verdict.why or verdict.blocker):
                verdict = FINE  # most of them: one kept for all
            self._kept[filename] = key if verdict is FINE and not done else (key, done, verdict)
        else:
            self._kept.pop(filename, None)
        return verdict

    def forget(self, filename: str) -> None:
        self._kept.pop(filename, None)
