"""Rerun on change: stamps under ROOT/stamps/ say what content (and which producers' runs) a done job ran with.

A stamp is `ROOT/stamps/<job name>.json`, written atomically when a plan job (one with PLAN= and OUTPUTS=)
ends done: `{"version": 1, "job": FILE, "sha": sha256 of its body (`content_hash`), "id": this run,
"producers": {FILE: that producer's stamp id when this job ran}, "ts": ...}`. A push that makes a job
stale rewrites its stamp with `"sha": ""` and `"stale": why` (the old `id` kept), so the runner reruns
it after its producers. A queued job whose DONE_IF holds is really done only when its stamp matches its
current content and its producers' current stamps; a job with no stamp (a queue from before stamps, a
seed job) keeps the old rule: DONE_IF alone. `rerun: never` in the plan (manifest.json) keeps it too.
The runner (`stamp_judge.judge`, `record_done`) and the push diff (`stamp_push.push_effects`) both decide from
these functions.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from runner import jobfile
from runner.digest import sha256_hex
from runner.files import atomic_write, loads, make_dir, open_regular
from runner.queue import timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from runner.state import Problem  # (field, what was wrong): reported as state-corrupt, like state.json's

STAMPS_DIR = "stamps"
VERSION = 1

# Content hashes of queued files, by path and (mtime, size, inode): a stale job waiting for its producer is
# judged every tick, and need not be read again each time.
_hashes: dict[str, tuple[tuple[int, int, int], str]] = {}
_reads: dict[str, tuple[tuple[int, int, int], tuple[dict[str, Any] | None, list[Problem]]]] = {}


def content_hash(data: bytes) -> str:
    """What a job runs, hashed: the sha256 of its body, the lines after its header (as `jobfile.parse` splits
    them). The header is left out: a new TIMEOUT, RETRIES, LANE or WARN_AFTER changes how the job is
    scheduled, not what it makes, and PLAN= carries a digest of them all."""
    lines = data.split(b"\n")
    start = 1 if lines and lines[0].startswith(b"#!") else 0
    while start < len(lines) and lines[start].startswith(b"#"):
        start += 1
    return sha256_hex(b"\n".join(lines[start:]))


def stamp_name(filename: str) -> str:
    return f"{STAMPS_DIR}/{jobfile.job_name(filename)}.json"


def stamped(job: jobfile.JobFile) -> bool:
    """Only plan jobs that promise outputs are stamped: seed jobs and jobs without outputs keep the old rule."""
    return bool(job.plan and job.outputs)


def check(raw: Any, filename: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    """A stamp as read (None for none); one of the wrong shape is treated as missing and its problem named."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [("(whole file)", f"expected an object, got {type(raw).__name__}: treated as no stamp")]
    producers = raw.get("producers", {})
    wrong = [
        key
        for key, ok in (
            ("sha", isinstance(raw.get("sha"), str)),
            ("id", isinstance(raw.get("id"), str)),
            (
                "producers",
                isinstance(producers, dict) and all(isinstance(v, str) or v is None for v in producers.values()),
            ),
        )
        if not ok
    ]
    if wrong:
        return None, [
            (key, f"missing or of the wrong type in the stamp of {filename}: treated as no stamp") for key in wrong
        ]
    return raw, []


def read(root: str, filename: str) -> tuple[dict[str, Any] | None, list[Problem]]:
    """FILENAME's stamp under ROOT; a torn or garbage file reads as no stamp, with the problem. Parsed once per
    version of the file (the runner asks every tick for each queued job that has one)."""
    path = os.path.join(root, stamp_name(filename))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return None, [("(read)", f"cannot stat it: {exc.strerror or exc}: treated as no stamp")]
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _reads.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with open_regular(path) as handle:  # a FIFO here would hold every push's probe
            data = handle.read()
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return None, [("(read)", f"cannot read it: {exc.strerror or exc}: treated as no stamp")]
    try:
        found = check(loads(data), filename)
    except ValueError:
        found = None, [("(whole file)", "not valid JSON (torn or garbage): treated as no stamp")]
    if len(_reads) > 100_000:
        _reads.clear()
    _reads[path] = (key, found)
    return found


def read_all(root: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[Problem]]]:
    """Every stamp under ROOT by job file name, and the problems of those that could not be used."""
    found: dict[str, dict[str, Any]] = {}
    problems: dict[str, list[Problem]] = {}
    try:
        names = sorted(os.listdir(os.path.join(root, STAMPS_DIR)))
    except OSError:
        return found, problems
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        filename = name[:-5] + ".job"
        stamp, wrong = read(root, filename)
        if stamp is not None:
            found[filename] = stamp
        if wrong:
            problems[stamp_name(filename)] = wrong
    return found, problems


def _write(root: str, filename: str, stamp: dict[str, Any]) -> None:
    path = Path(root) / stamp_name(filename)
    make_dir(str(path.parent))
    atomic_write(path, (json.dumps(stamp, sort_keys=True) + "\n").encode())


def queued_path(root: str, filename: str) -> str:
    return os.path.join(root, "queue", filename)


def try_write(root: str, filename: str, stamp: dict[str, Any]) -> list[Problem]:
    try:
        _write(root, filename, stamp)
    except OSError as exc:
        return [("(write)", f"cannot write it: {exc.strerror or exc}")]
    return []


def ran_again(recorded: str | None, current: str | None) -> bool:
    """Whether a producer ran since its consumer did: only a real run (a non-empty id) is evidence; a
    producer with no stamp, or an adopted one (id ""), has produced nothing new that we know of."""
    return bool(current) and current != recorded


def _entry(manifest: Mapping[str, Any] | None, filename: str) -> Mapping[str, Any]:
    entry = ((manifest or {}).get("jobs") or {}).get(filename)
    return entry if isinstance(entry, Mapping) else {}


def producers_of(manifest: Mapping[str, Any] | None, filename: str) -> list[str]:
    """The jobs FILENAME requires, from manifest.json's graph (none for a job push did not send)."""
    after = _entry(manifest, filename).get("after") or []
    return [p for p in after if isinstance(p, str)]


def rerun_never(manifest: Mapping[str, Any] | None, filename: str) -> bool:
    return _entry(manifest, filename).get("rerun") == "never"


def current_ids(root: str, producers: Sequence[str]) -> dict[str, str | None]:
    ids: dict[str, str | None] = {}
    for producer in producers:
        stamp, _ = read(root, producer)
        ids[producer] = stamp["id"] if stamp else None
    return ids


def file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = _hashes.get(path)
        if cached and cached[0] == key:
            return cached[1]
        with open_regular(path) as handle:
            digest = content_hash(handle.read())
    except OSError:
        return None
    _hashes[path] = (key, digest)
    if len(_hashes) > 100_000:
        _hashes.clear()
    return digest


def new_stamp(filename: str, sha: str, producers: Mapping[str, str | None], now: float, run: bool) -> dict[str, Any]:
    """A stamp for FILENAME; RUN false adopts a job found done without a stamp (id "": no run was seen)."""
    body = {"version": VERSION, "job": filename, "sha": sha, "producers": dict(producers), "ts": timestamp(now)}
    ident = sha256_hex(json.dumps(body, sort_keys=True).encode() + os.urandom(8))[:16]
    return {**body, "id": ident if run else ""}


def record_done(
    root: str, filename: str, job: jobfile.JobFile, manifest: Mapping[str, Any] | None, now: float
) -> tuple[str, list[Problem]]:
    """Stamp FILENAME (still in running/) as done now; the problems of a stamp that could not be written."""
    if not stamped(job):
        return stamp_name(filename), []
    sha = file_hash(os.path.join(root, "running", filename))
    if sha is None:
        return stamp_name(filename), [("(write)", "the job file could not be read to hash it: no stamp written")]
    stamp = new_stamp(filename, sha, current_ids(root, producers_of(manifest, filename)), now, run=True)
    try:
        _write(root, filename, stamp)
    except OSError as exc:
        return stamp_name(filename), [("(write)", f"cannot write it: {exc.strerror or exc}")]
    return stamp_name(filename), []


def mark_stale(root: str, marks: Sequence[Sequence[str]]) -> None:
    """Push's side: each (file, why) will run again; its stamp says so until it runs (the old id kept, so its
    consumers still see which run they used)."""
    for filename, why in marks:
        old, _ = read(root, filename)
        stamp = {
            "version": VERSION,
            "job": filename,
            "sha": "",
            "id": old["id"] if old else "",
            "producers": old["producers"] if old else {},
            "stale": why,
            "ts": timestamp(time.time()),
        }
        _write(root, filename, stamp)
