"""status.json, rewritten by the sweep when something in it changed (at least every REFRESH_S), and
heartbeat.json every tick.

status.json lists every waiting job (`queued`); it is written by the sweep (every --tick), never after a job's
end: at 10 000 queued jobs re-encoding every job's entry was most of a tick. The list is encoded as it is
written, and only when a reason or the queue changed since the last write. heartbeat.json, small
and written every tick, carries what changes between sweeps: the heartbeat (what `plan watch` judges a runner
alive by), the lanes, the running jobs, the counts (by state, and of waiting jobs by reason), and the entries of
the jobs whose reason changed since status.json listed them (`queued_set`, `queued_gone`): a job's end judges a
few jobs, and only those are written again. `queue.fresh_status` lays it over status.json for every reader.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator, Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any, NamedTuple

from runner import FORMAT_VERSION, __version__, commit, formats, how_started, logs
from runner.config import Config
from runner.files import atomic_write, open_file
from runner.procs import GpuUser
from runner.queue import STATES, WAITING_FILE, Queue, timestamp
from runner.records import Parsed, Reason, Running
from runner.service.announce import LaneView, progress
from runner.service.gpu import Observation, gpu_status
from runner.service.reasons import Reasons
from runner.views.waiting import Summary as WaitingSummary

# status.json is rewritten at least this often even when nothing in it changed: a reader older than
# heartbeat.json (which judges the runner by status.json's heartbeat alone, dead after 300 s) stays content.
REFRESH_S = 60.0


def _encode(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Snapshot(NamedTuple):
    """What status.json shows of the runner at one tick, taken by the runner (`Runner.snapshot`): the status file
    reads this value, never the runner's parts. `reasons` is the one live part it reads (each queued job's entry
    is kept encoded and read again only when its generation changed)."""

    pid: int
    instance: str
    root: str
    started_at: float
    ticks: int
    config: Config
    lane_state: Mapping[str, LaneView]
    lane_since: Mapping[str, float]
    running: tuple[Running, ...]
    park: str
    park_lanes: Mapping[str, str]
    gpu_unknown: tuple[GpuUser, ...]
    gpu_seen: Observation | None  # the last look at the GPUs
    disk_full: str
    write_errors: Mapping[str, str]
    leaks: tuple[tuple[int, str], ...]  # (pid, the job that left it), only the live ones
    reasons: Reasons
    scan_generation: int
    incidents: int = 0  # open in the incident book (runner.alerts)
    delivery: Mapping[str, Any] | None = None  # how --notify and --ping went (runner.alerts.engine.Alerts.delivery)
    sweep: bool = True  # the timer's tick (it judged queued jobs for the sweep): status.json and waiting.json again
    swept: float | None = None  # when the last pass over every queued job began (every reason is at most this old)
    sweeping: Mapping[str, Any] | None = None  # the pass in progress: when it began, how many it judged so far
    taken: Mapping[str, Parsed] | None = None  # the queued jobs by name (their lanes)
    manifest_jobs: Mapping[str, Any] | None = None  # manifest.json's jobs (the estimates read a few of them)


class StatusFile:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._written_queued: tuple[Any, ...] | None = None  # what the list written last was made from
        self._waiting_key: tuple[int, int, int] | None = None
        self._summary: dict[str, Any] = {}  # the last list's, in status.json (runner.views.waiting.summary)
        self._content: str | None = None  # status.json as last written, less its clock
        self._written_key: tuple[int, int, int] | None = None
        self._written_at = 0.0
        self._counts: dict[str, tuple[int, int, int]] = {}  # state -> (directory mtime, files, our moves then)
        self.writes = 0  # status.json writes (a test counts them)

    def write(self, runner: Snapshot, now: float, queued: list[tuple[str, Parsed]], force: bool = False) -> None:
        """heartbeat.json, and status.json where this tick is a sweep (or FORCE) and something in it changed."""
        running = self._running(runner)
        status = self._status(runner, running)
        full = runner.sweep or force or now - self._written_at >= REFRESH_S
        try:
            if full:  # first: a reader never finds a heartbeat without the entries judged since an older list
                copied = [dict(entry) for entry in running]
                whole = dict(status, runner=dict(status["runner"]), running=copied)
                self._full(runner, now, queued, whole, copied, force)
        finally:
            self._beat(runner, now, status, running, delta=not full)

    def _beat(
        self, runner: Snapshot, now: float, status: dict[str, Any], running: list[dict[str, Any]], delta: bool
    ) -> None:
        """heartbeat.json: the clock, and what changes between sweeps (DELTA: the waiting jobs judged since
        status.json listed them all). Not fsync()ed: it is rewritten next tick, and a crash loses nothing a
        reader needs from it."""
        shown = {k: v for k, v in status.items() if k != "runner"}
        shown["running"] = [
            {**entry, "elapsed_s": round(now - run.started, 1)} for entry, run in zip(running, runner.running)
        ]
        beat: dict[str, Any] = {
            "pid": runner.pid,
            "instance": runner.instance,
            "heartbeat": now,
            "heartbeat_ts": timestamp(now),
            "tick": runner.ticks,
            "swept": runner.swept,
            "sweep": runner.sweeping,
            "status": shown,
        }
        if delta:
            gone, changed = [], []
            lanes = runner.taken or {}
            for filename in sorted(runner.reasons.changed):
                reason = runner.reasons.get(filename)
                if reason is None:
                    gone.append(filename)
                else:
                    parsed = lanes.get(filename)
                    changed.append(_entry(filename, getattr(parsed.job, "lane", None) if parsed else None, reason))
            beat["queued_gone"], beat["queued_set"] = gone, changed
            # what waiting.json said of them: status.json's summary is moved on by them (runner.views.waiting.patch)
            beat["queued_was"] = {f: list(w) for f, w in runner.reasons.was.items()}
        path = self.queue.heartbeat_path
        tmp = path.with_name("." + path.name + ".tmp")  # one runner per root (its lock): one writer of this
        fd = open_file(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # never through a symlink
        try:
            os.write(fd, (_encode(beat) + "\n").encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _full(
        self,
        runner: Snapshot,
        now: float,
        queued: list[tuple[str, Parsed]],
        status: dict[str, Any],
        running: list[dict[str, Any]],
        force: bool,
    ) -> None:
        """waiting.json with every waiting job where a reason or the queue changed (or FORCE), and status.json with
        their summary where something in it changed (or FORCE, or REFRESH_S passed)."""
        queued_key = (runner.scan_generation, runner.reasons.generation, len(queued))
        path = self.queue.waiting_path
        if force or queued_key != self._written_queued or _key(path) != self._waiting_key:
            self._list(runner, now, queued, queued_key)
        status.update(self._summary)
        status["estimate_jobs"] = _estimate_jobs(runner, status)
        content = _encode(status)
        same = content == self._content and _key(self.queue.status_path) == self._written_key  # nobody replaced it
        if not force and same and now - self._written_at < REFRESH_S:
            return
        status["runner"].update(heartbeat=now, heartbeat_ts=timestamp(now), tick=runner.ticks)
        status["swept"], status["sweep"] = runner.swept, runner.sweeping  # as the heartbeat says them, every tick
        for entry, run in zip(running, runner.running):
            entry["elapsed_s"] = round(now - run.started, 1)
        atomic_write(self.queue.status_path, (_encode(status) + "\n").encode())
        self._content, self._written_at = content, now
        self._written_key = _key(self.queue.status_path)
        self.writes += 1

    def _list(self, runner: Snapshot, now: float, queued: list[tuple[str, Parsed]], key: tuple[Any, ...]) -> None:
        """waiting.json: every waiting job's entry, encoded as it is written, a few hundred at a time (neither the
        list nor its encoding is kept, or whole at once: 10 000 entries were 3 MB); their summary for status.json
        is made as they go (runner.views.waiting.summary), in memory that does not grow with the queue."""
        summary = WaitingSummary(now)
        head = _encode({"instance": runner.instance, "listed": now, "swept": runner.swept})
        parts = itertools.chain((head[:-1].encode(), b',"queued":['), _entries(runner, queued, summary), (b"]}\n",))
        atomic_write(self.queue.waiting_path, parts)
        self._summary = {**summary.result(), "waiting_file": WAITING_FILE}
        self._written_queued, self._waiting_key = key, _key(self.queue.waiting_path)
        runner.reasons.listed()

    def _status(self, runner: Snapshot, running: list[dict[str, Any]]) -> dict[str, Any]:
        """Everything but the queued jobs and the clock (heartbeat, tick, elapsed times)."""
        return {
            "runner": {
                "pid": runner.pid,
                "version": __version__,
                "format_version": FORMAT_VERSION,
                "instance": runner.instance,
                "root": runner.root,
                "started": runner.started_at,
                "started_by": how_started(os.environ),  # systemd unit, plan bootstrap --start, or by hand
                "commit": commit(),
                "formats": formats(),
                "tick_s": runner.config.tick_s,
            },
            "lane_order": list(runner.config.lanes),
            "lanes": {
                lane: {
                    "state": v.state,
                    "job": v.job,
                    "reason": v.reason,
                    "blocker": v.blocker,
                    "since": runner.lane_since.get(lane),
                    "slots": runner.config.slots_of(lane),
                    "busy": sum(1 for run in runner.running if run.lane == lane),
                }
                for lane, v in runner.lane_state.items()
            },
            "running": running,
            "parked": runner.park or None,
            "parked_lanes": dict(runner.park_lanes) or None,
            "gpu_unknown": {
                "count": len(runner.gpu_unknown),
                "policy": runner.config.unreadable_gpu,
                "processes": [{"pid": u.pid, "cmd": u.cmd[:120]} for u in runner.gpu_unknown[:20]],
            },
            "gpus": gpu_status(
                runner.gpu_seen,
                runner.config.gpus,
                {run.filename: run.gpus for run in runner.running if run.gpus},
            ),
            "counts": {s: self.count(s, exact=runner.sweep) for s in STATES},
            "disk_full": runner.disk_full or None,
            "write_errors": {
                **runner.write_errors,
                **({"events.jsonl": self.queue.events_error} if self.queue.events_error else {}),
            },
            "waiting": dict(sorted(runner.reasons.by_reason.items())),
            "incidents": runner.incidents,
            "delivery": runner.delivery,
            "leaks": [{"pid": pid, "left_by": job} for pid, job in runner.leaks],
        }

    def _running(self, runner: Snapshot) -> list[dict[str, Any]]:
        running = []
        for run in runner.running:
            path = self.queue.log_path(run.filename)
            running.append(
                {
                    "job": run.filename,
                    "lane": run.lane,
                    "pid": run.pid,
                    "attempt": run.attempt,
                    "started": run.started,
                    "log": str(path),
                    "log_size": run.log_size,
                    "log_grew_at": run.log_grew_at,
                    "timeout_s": run.job.timeout_s,
                    "warn_after_s": run.job.warn_after_s or runner.config.warn_after.get(run.lane),
                    "last_line": logs.last_line(path),
                    "progress": progress(path),
                    **({"gpus": list(run.gpus)} if run.gpus else {}),
                }
            )
        return running

    def count(self, state: str, exact: bool = True) -> int:
        """Files in STATE, listed again only when its directory changed (or changed within the last second,
        finer than some filesystems' mtime). Not EXACT (a tick between sweeps): the last listing and the moves
        this runner made since (a file another process put there is counted at the next sweep)."""
        cached = self._counts.get(state)
        if not exact and cached is not None:
            return cached[1] + self.queue.moves.get(state, 0) - cached[2]
        path = self.queue.dir(state)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = -1
        moves = self.queue.moves.get(state, 0)
        if cached is not None and cached[0] == mtime and time.time() - mtime / 1e9 > 1.0:
            return cached[1] + moves - cached[2]
        count = len(self.queue.jobs(state))
        self._counts[state] = (mtime, count, moves)
        return count


def _entry(filename: str, lane: str | None, reason: Reason) -> dict[str, Any]:
    """A waiting job as status.json lists it."""
    return {
        "job": filename,
        "lane": lane,
        "reason": reason.reason,
        "detail": reason.detail,
        "blocker": reason.blocker,
        "since": reason.since,
    }


def _entries(
    runner: Snapshot, queued: list[tuple[str, Parsed]], summary: WaitingSummary, chunk: int = 500
) -> Iterator[bytes]:
    """Each waiting job's entry, encoded, comma-separated, CHUNK at a time; each added to SUMMARY as it goes."""
    batch: list[str] = []
    first = True
    # Most waiting jobs share their reason (one Reason object for 100,000 jobs waiting for their lane since one
    # tick): an entry is encoded as its reason's and lane's parts, encoded once, around the job's name (at 100,000
    # queued, encoding each entry whole was 0.5 s of every tick whose sweep changed a reason).
    parts: dict[tuple[int, str | None], tuple[Reason, str, str]] = {}
    for filename, lane in _waiting(runner.reasons, queued, runner.taken):
        reason = runner.reasons.get(filename)
        assert reason is not None
        entry = _entry(filename, lane, reason)
        summary.add(entry)
        part = parts.get((id(reason), lane))
        if part is None or part[0] is not reason:
            head, tail = _encode({"blocker": reason.blocker, "detail": reason.detail}), _encode(entry)
            tail = tail[tail.index(',"lane":') :]  # the keys sorted: blocker, detail, job, lane, reason, since
            part = (reason, head[:-1] + ',"job":', tail)
            if len(parts) < 4096:  # the reason is kept with its parts: its id names no other while they are
                parts[(id(reason), lane)] = part
        batch.append(part[1] + encode_basestring_ascii(filename) + part[2])  # as json.dumps does a str
        if len(batch) >= chunk:
            yield (("" if first else ",") + ",".join(batch)).encode()
            batch, first = [], False
    if batch:
        yield (("" if first else ",") + ",".join(batch)).encode()


def _estimate_jobs(runner: Snapshot, status: dict[str, Any]) -> dict[str, Any]:
    """manifest.json's `family` and `after` of the jobs the estimates read (those running, each lane's first
    waiting): `plan status` then never reads the whole manifest (6 MB at 10 000 jobs) for a few of its entries."""
    jobs = runner.manifest_jobs or {}
    found: dict[str, Any] = {}
    for item in [*status.get("running", ()), *status.get("queued_first", ())]:
        spec = jobs.get(item["job"])  # None: a job no plan pushed (written by hand)
        found[item["job"]] = {key: spec[key] for key in ("family", "after") if key in spec} if spec else None
    return found


def _key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _waiting(
    reasons: Reasons, queued: list[tuple[str, Parsed]], taken: Mapping[str, Parsed] | None
) -> Iterator[tuple[str, str | None]]:
    """(job, lane) of each entry: queued jobs with a reason, then files not yet jobs (settling, or invalid and
    stuck in queue/). TAKEN: QUEUED by name (the scanner's table: no set of every name made here, 4 MB at
    100,000); made from QUEUED where not given or not the same jobs (a write with no queued list)."""
    for filename, parsed in queued:
        if filename in reasons:
            yield filename, parsed.job.lane  # type: ignore[union-attr]
    names = taken if taken is not None and len(taken) == len(queued) else {filename for filename, _ in queued}
    for filename in sorted(f for f, _ in reasons.items() if f not in names):
        yield filename, None
