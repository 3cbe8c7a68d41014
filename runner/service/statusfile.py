"""status.json, rewritten by the sweep when something in it changed (at least every REFRESH_S), waiting.json when
enough changed since it was, and heartbeat.json every tick.

waiting.json lists every waiting job; status.json carries their summary (runner.views.waiting.summary), which does
not grow with the queue. Neither is written after a job's end: at 10 000 queued jobs re-encoding every job's entry
was most of a tick. waiting.json is written whole by a sweep once WHOLE_BOUND entries changed since it was (or the
first of them changed WHOLE_AGE_S ago); until then status.json carries those entries (`queued_set`, `queued_gone`
since the list named by `listed`), and its summary is moved on by each sweep's changes: a pass that changes every
reason at 100,000 queued rewrites the 14 MB list every few ticks, not every tick, and an idle queue never.
heartbeat.json, small and written every tick, carries what changes between sweeps: the heartbeat (what `plan watch`
judges a runner alive by), the lanes, the running jobs, the counts (by state, and of waiting jobs by reason), and the
entries of the jobs whose reason changed since status.json was written (`queued_set`, `queued_gone`, `queued_was`):
a job's end judges a few jobs, and only those are written again. `queue.fresh_status` lays them over status.json
(and waiting.json) for every reader.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from runner import FORMAT_VERSION, __version__, commit, formats, how_started, logs
from runner.config import Config
from runner.estimates import PER_LANE
from runner.files import atomic_write, open_file
from runner.procs import GpuUser
from runner.queue import STATES, WAITING_FILE, Queue, timestamp
from runner.records import Parsed, Reason, Running
from runner.service.announce import LaneView, progress
from runner.service.gpuseen import gpu_status
from runner.service.reasons import UNLISTED_MAX, Reasons
from runner.views.waiting import Summary as WaitingSummary
from runner.views.waiting import patch

if TYPE_CHECKING:
    from runner.service.gpu import Observation

# status.json is rewritten at least this often even when nothing in it changed: a reader older than
# heartbeat.json (which judges the runner by status.json's heartbeat alone, dead after 300 s) stays content.
REFRESH_S = 60.0
# waiting.json is written whole again when more entries than a tenth of the waiting jobs (within these bounds) changed
# since it was, or when the first of them changed WHOLE_AGE_S ago: status.json carries them meanwhile, so they are
# bounded in number (what `plan status` reads) and in age (what an older reader of the list alone misses).
WHOLE_MIN, WHOLE_MAX = 1000, UNLISTED_MAX
WHOLE_AGE_S = 300.0


def whole_bound(waiting: int) -> int:
    """How many changed entries status.json carries at most for WAITING jobs before waiting.json is written whole."""
    return min(max(WHOLE_MIN, waiting // 10), WHOLE_MAX)


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
        self._waiting_key: tuple[int, int, int] | None = None  # waiting.json as written (nobody replaced it)
        self._listed: float | None = None  # when waiting.json was last written whole (its `listed`)
        self._unlisted_since: float | None = None  # the first write that found entries changed since then
        self._summary: dict[str, Any] = {}  # the waiting jobs' summary as status.json last said it
        self.lists = 0  # waiting.json writes (a test counts them)
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
            if full:  # first: a reader never finds a heartbeat without the entries judged since an older status
                copied = [dict(entry) for entry in running]
                whole = dict(status, runner=dict(status["runner"]), running=copied)
                self._full(runner, now, queued, whole, copied, force)
        finally:
            self._beat(runner, now, status, running)

    def _beat(self, runner: Snapshot, now: float, status: dict[str, Any], running: list[dict[str, Any]]) -> None:
        """heartbeat.json: the clock, and what changes between sweeps (the waiting jobs judged since status.json
        was written). Not fsync()ed: it is rewritten next tick, and a crash loses nothing a reader needs from it."""
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
        beat["queued_set"], beat["queued_gone"] = _delta(runner, runner.reasons.changed)
        # what status.json said of them: its summary is moved on by them (runner.views.waiting.patch)
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
        """waiting.json with every waiting job where enough changed since it was (or FORCE), and status.json with
        their summary and the entries changed since the list, where something in it changed (or FORCE, or
        REFRESH_S passed)."""
        reasons = runner.reasons
        if reasons.unlisted and self._unlisted_since is None:
            self._unlisted_since = now
        listed = (
            not force
            and self._listed is not None
            and bool(self._summary)  # a status.json was written (one that failed after the list: the list again)
            and _key(self.queue.waiting_path) == self._waiting_key  # nobody replaced it
            and reasons.unlisted is not None
            and len(reasons.unlisted) <= whole_bound(len(reasons.table))
            and (self._unlisted_since is None or now - self._unlisted_since < WHOLE_AGE_S)
        )
        if listed:
            summary = self._moved(runner)
        else:
            summary = self._list(runner, now, queued)
        status.update(summary)
        status["estimate_jobs"] = _estimate_jobs(runner, status)
        status["listed"] = self._listed
        unlisted = _encoded_delta(runner, reasons.unlisted) if listed and reasons.unlisted else ("", [])
        content = _encode(dict(status, queued_gone=unlisted[1])) + unlisted[0]
        same = content == self._content and _key(self.queue.status_path) == self._written_key  # nobody replaced it
        if not force and same and now - self._written_at < REFRESH_S:
            return
        status["runner"].update(heartbeat=now, heartbeat_ts=timestamp(now), tick=runner.ticks)
        status["swept"], status["sweep"] = runner.swept, runner.sweeping  # as the heartbeat says them, every tick
        for entry, run in zip(running, runner.running):
            entry["elapsed_s"] = round(now - run.started, 1)
        text = _encode(dict(status, queued_gone=unlisted[1]))
        atomic_write(self.queue.status_path, f'{text[:-1]},"queued_set":[{unlisted[0]}]}}\n'.encode())
        self._content, self._written_at = content, now
        self._written_key = _key(self.queue.status_path)
        self._summary = summary
        reasons.written()
        self.writes += 1

    def _moved(self, runner: Snapshot) -> dict[str, Any]:
        """The summary status.json last said, moved on by the entries changed since (runner.views.waiting.patch:
        each job leaves the group it was counted in and joins its new one), and each lane's first waiting jobs as
        they are now (where some left, those after them are shown by the next list)."""
        reasons, last = runner.reasons, self._summary
        if not reasons.changed:
            return last
        changed, gone = _delta(runner, reasons.changed)
        was = {f: list(w) for f, w in reasons.was.items()}
        moved = patch(last["waiting_groups"], last["waiting_count"], changed, gone, was)
        assert moved is not None  # made here, a summary
        left = set(gone)
        shown = {e["job"]: e for e in last["queued_first"] if e["job"] not in left}
        shown.update((e["job"], e) for e in changed)
        first: list[dict[str, Any]] = []
        per_lane: dict[str, int] = {}
        for entry in sorted(shown.values(), key=lambda e: (e["lane"] is None, e["job"])):  # as the list orders them
            count = per_lane.get(str(entry["lane"]), 0)
            if count < PER_LANE:
                per_lane[str(entry["lane"])] = count + 1
                first.append(entry)
        return dict(last, waiting_groups=moved[0], waiting_count=moved[1], queued_first=first)

    def _list(self, runner: Snapshot, now: float, queued: list[tuple[str, Parsed]]) -> dict[str, Any]:
        """waiting.json: every waiting job's entry, encoded as it is written, a few hundred at a time (neither the
        list nor its encoding is kept, or whole at once: 10 000 entries were 3 MB); their summary for status.json
        (returned) is made as they go (runner.views.waiting.summary), in memory that does not grow with the queue."""
        summary = WaitingSummary(now)
        head = _encode({"instance": runner.instance, "listed": now, "swept": runner.swept})
        parts = itertools.chain((head[:-1].encode(), b',"queued":['), _entries(runner, queued, summary), (b"]}\n",))
        atomic_write(self.queue.waiting_path, parts)
        self._listed, self._unlisted_since = now, None
        self._waiting_key = _key(self.queue.waiting_path)
        runner.reasons.listed()
        self.lists += 1
        return {**summary.result(), "waiting_file": WAITING_FILE}

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


class _Encoder:
    """Entries encoded as json.dumps would (keys sorted), from their reason's and lane's parts, encoded once around
    the job's name: most waiting jobs share their reason (one Reason object for 100,000 jobs waiting for their lane
    since one tick), and at 100,000 queued encoding each entry whole was 0.5 s of every list."""

    def __init__(self) -> None:
        self._parts: dict[tuple[int, str | None], tuple[Reason, str, str]] = {}

    def __call__(self, filename: str, lane: str | None, reason: Reason, entry: dict[str, Any] | None = None) -> str:
        part = self._parts.get((id(reason), lane))
        if part is None or part[0] is not reason:
            head = _encode({"blocker": reason.blocker, "detail": reason.detail})
            tail = _encode(entry or _entry(filename, lane, reason))
            tail = tail[tail.index(',"lane":') :]  # the keys sorted: blocker, detail, job, lane, reason, since
            part = (reason, head[:-1] + ',"job":', tail)
            if len(self._parts) < 4096:  # the reason is kept with its parts: its id names no other while they are
                self._parts[(id(reason), lane)] = part
        return part[1] + encode_basestring_ascii(filename) + part[2]  # as json.dumps does a str


def _entries(
    runner: Snapshot, queued: list[tuple[str, Parsed]], summary: WaitingSummary, chunk: int = 500
) -> Iterator[bytes]:
    """Each waiting job's entry, encoded, comma-separated, CHUNK at a time; each added to SUMMARY as it goes."""
    batch: list[str] = []
    first = True
    encode = _Encoder()
    for filename, lane, reason in _waiting(runner.reasons, queued, runner.taken):
        entry = _entry(filename, lane, reason)
        summary.add(entry)
        batch.append(encode(filename, lane, reason, entry))
        if len(batch) >= chunk:
            yield (("" if first else ",") + ",".join(batch)).encode()
            batch, first = [], False
    if batch:
        yield (("" if first else ",") + ",".join(batch)).encode()


def _lane(runner: Snapshot, filename: str) -> str | None:
    parsed = (runner.taken or {}).get(filename)
    return getattr(parsed.job, "lane", None) if parsed else None


def _delta(runner: Snapshot, names: Iterable[str], make: Any = None) -> tuple[list[Any], list[str]]:
    """The entries of NAMES that wait, in name order (made by MAKE: _entry's dicts, or an _Encoder's strings), and
    those that wait no more (they left the queue, or run)."""
    make = make or _entry
    changed, gone = [], []
    for filename in sorted(names):
        reason = runner.reasons.get(filename)
        if reason is None:
            gone.append(filename)
        else:
            changed.append(make(filename, _lane(runner, filename), reason))
    return changed, gone


def _encoded_delta(runner: Snapshot, names: Iterable[str]) -> tuple[str, list[str]]:
    """_delta's entries encoded and comma-separated (up to WHOLE_MAX of them, a sweep's), and the names gone."""
    entries, gone = _delta(runner, names, _Encoder())
    return ",".join(entries), gone


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
) -> Iterator[tuple[str, str | None, Reason]]:
    """(job, lane, reason) of each entry: queued jobs with a reason, then files not yet jobs (settling, or invalid
    and stuck in queue/). TAKEN: QUEUED by name (the scanner's table: no set of every name made here, 4 MB at
    100,000); made from QUEUED where not given or not the same jobs (a write with no queued list)."""
    table = reasons.table  # its own lookups, read only: 100,000 calls of Reasons' methods were a sixth of a list
    for filename, parsed in queued:
        reason = table.get(filename)
        if reason is not None:
            yield filename, parsed.job.lane, reason  # type: ignore[union-attr]
    names = taken if taken is not None and len(taken) == len(queued) else {filename for filename, _ in queued}
    for filename in sorted(f for f in table if f not in names):
        yield filename, None, table[filename]
