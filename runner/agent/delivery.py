"""The host side of `plan push`: probe and install with compare-and-swap (the push lock is runner/pushlock.py).

manifest.json records every plan that pushed to the root (contract 2): `plans` maps each plan's name to the
jobs it owns, its hash, when and by whom; `jobs`, `producers` and `external` are their union, which is what
the runner reads for `blocked`; `generation` counts installs, and an install names the generation it diffed
against, so a push that looked at an older queue is refused instead of mixing two versions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from runner import MANIFEST_VERSION, identity, jobfile, pushlock, refusal, stamps
from runner.controls import request_name
from runner.digest import sha256_hex
from runner.errors import AgentError
from runner.files import (
    atomic_write,
    file_mode,
    fsync_dir,
    json_with,
    make_dir,
    open_regular,
    read_json,
    read_json_or_none,
    write_all_durably,
)
from runner.queue import INSTALL_RECORD, STATES, Queue, fresh_status, pending_install, timestamp
from runner.readers import last_lifecycle, runner_alive

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STAGE_PREFIX = ".plan-stage-"
STAGE_MAX_AGE_S = 3600.0  # a staging dir this old belongs to a push that died: anyone may remove it
ADHOC_PLAN = "adhoc"  # the plan `plan add` installs one-off jobs in (runner/agent/adhoc.py): owned like any plan's


def read_manifest(root: str) -> dict[str, Any]:
    """manifest.json in the current shape; a single-plan manifest of the first format is read as one plan."""
    try:
        raw = read_json(Path(root) / "manifest.json")
    except (OSError, ValueError):
        raw = None
    raw = raw if isinstance(raw, dict) else {}
    plans = raw.get("plans")
    if not isinstance(plans, dict):
        plans = {}
        if isinstance(raw.get("plan"), str) and isinstance(raw.get("jobs"), dict):
            plans[raw["plan"]] = {
                "jobs": raw["jobs"],
                "producers": raw.get("producers") or {},
                "external": raw.get("external") or [],
            }
    generation = raw.get("generation")
    held = raw.get("version")
    return {
        "generation": generation if isinstance(generation, int) else 0,
        "plans": plans,
        "plan": raw.get("plan") if isinstance(raw.get("plan"), str) else None,
        # the format this root's manifest is in, and who wrote it: an older client may not rewrite it
        "holds": {"manifest": held if isinstance(held, int) else 1, "written_by": raw.get("written_by")},
    }


def owners(manifest: dict[str, Any]) -> dict[str, str]:
    """Job file name -> the plan that owns it, from manifest.json."""
    found: dict[str, str] = {}
    for plan, record in manifest["plans"].items():
        for name in (record.get("jobs") or {}) if isinstance(record, dict) else {}:
            found[name] = plan
    return found


def _header(name: str, data: bytes, lanes: list[str]) -> jobfile.JobFile | None:
    """The header as the runner reads it (runner.jobfile.parse); None for an invalid job."""
    parsed = jobfile.parse(name, data, lanes)
    return parsed if isinstance(parsed, jobfile.JobFile) else None


def _failures(root: str, failed: dict[str, Any]) -> dict[str, Any]:
    """Each failed job's attempts used and allowed and its last failure, from state.json (for held jobs)."""
    raw = read_json_or_none(os.path.join(root, "state.json"))
    state: dict[str, Any] = raw if isinstance(raw, dict) else {}
    attempts = state["attempts"] if isinstance(state.get("attempts"), dict) else {}
    last = state["last_failure"] if isinstance(state.get("last_failure"), dict) else {}
    found = {}
    for name, info in failed.items():
        why: dict[str, Any] = last[name] if isinstance(last.get(name), dict) else {}
        found[name] = {
            "attempts": attempts.get(name) if isinstance(attempts.get(name), int) else None,
            "retries": info.pop("retries", None),
            "summary": why.get("summary") if isinstance(why.get("summary"), str) else "",
        }
    return found


def probe(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """What a push diffs against: each job file's hash and owning plan, manifest generation, runner health. Under
    the push lock, an install left pending (its push or agent killed during its renames) is finished first: the
    diff is made against one version, never against a queue partly renamed."""
    if pushlock.held(root):
        finish_pending(root)
    status = fresh_status(root, read_json_or_none(os.path.join(root, "status.json")))
    lanes = list(jobfile.DEFAULT_LANES)
    if isinstance(status, dict) and isinstance(status.get("lanes"), dict):
        lanes += [lane for lane in status["lanes"] if lane not in lanes]
    queue = Queue(Path(root))
    files: dict[str, dict[str, Any]] = {}
    for state in STATES:
        entries = {}
        for name in queue.jobs(state):
            try:
                with open_regular(os.path.join(root, state, name)) as handle:
                    data = handle.read()
            except OSError:
                continue
            parsed = _header(name, data, lanes)
            entry: dict[str, Any] = {"sha": sha256_hex(data), "plan": parsed.plan if parsed else None}
            if state == "failed":
                entry["retries"] = parsed.retries if parsed else None
            entries[name] = entry
        files[state] = entries
    manifest = read_manifest(root)
    missing = [p for p in request.get("external", []) if not os.path.exists(p.rstrip("/") or "/")]
    found, torn = stamps.read_all(root)
    failures = _failures(root, files.get("failed", {}))
    return {
        "files": files,
        "failures": failures,
        "holds": manifest["holds"],
        # the first contact: the box says whether the client that asks may write here (install asks again)
        "refused": refusal(manifest["holds"], request.get("client"), root),
        "box": identity(),
        "external_missing": missing,
        "status": status,
        "runner_alive": runner_alive(status),
        "lifecycle": last_lifecycle(root),
        "parked": read_json_or_none(os.path.join(root, "parked.json")),
        "generation": manifest["generation"],
        "owners": owners(manifest),
        "plans": {
            name: {
                **{k: v for k, v in record.items() if k in ("hash", "pushed_at", "by", "source")},
                # what each job writes, for the check of outputs two plans share
                "jobs": {
                    job: {k: spec.get(k) for k in ("outputs", "done_if") if k in spec}
                    for job, spec in (record.get("jobs") or {}).items()
                    if isinstance(spec, dict)
                },
            }
            for name, record in manifest["plans"].items()
            if isinstance(record, dict)
        },
        "stamps": found,
        "stamp_problems": {name: [list(p) for p in wrong] for name, wrong in torn.items()},
        "now": time.time(),
    }


def measure(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """The bytes each of `paths` holds (runner.stamps.cost): what a push's reruns would redo."""
    return {"sizes": stamps.measure(request.get("paths") or [])}


def _clean_stages(root: str, now: float) -> None:
    """Staging dirs of pushes that died long ago; a live push's own dir is never touched."""
    for name in os.listdir(root):
        if not name.startswith(STAGE_PREFIX):
            continue
        path = os.path.join(root, name)
        try:
            old = now - os.stat(path).st_mtime > STAGE_MAX_AGE_S
        except OSError:
            continue
        if old:
            shutil.rmtree(path, ignore_errors=True)


def install(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Stage the files, then (under the lock, if the generation still matches) rename them into queue/."""
    if not pushlock.held(root):
        got = pushlock.lock(root, {"wait_s": request.get("lock_wait_s", 60), "by": request.get("by")})
        if got.get("busy"):
            return got
    queue = Queue(Path(root))
    pushlock.keep_root(root)  # a push installs here: the root stays
    queue.ensure()
    make_dir(os.path.join(root, "control"))
    finish_pending(root)  # an install killed during its renames: finished before this one looks
    manifest = read_manifest(root)
    refused = refusal(manifest["holds"], request.get("client"), root)
    if refused:
        raise AgentError(refused)
    expected = request.get("generation")
    if expected is not None and expected != manifest["generation"]:
        return {"changed": True, "generation": manifest["generation"]}
    _clean_stages(root, time.time())
    stage = tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=root)
    try:
        files = request.get("files", {})
        _stage(root, stage, files)
        # The install record, durable before anything changes: whoever next takes the push lock or starts the
        # runner finishes an install killed during its renames (the runner starts no job while it is pending).
        pending = {key: request.get(key, []) for key in ("replace", "resets", "remove", "stale", "stop", "take_over")}
        pending.update(
            stage=os.path.basename(stage),
            files=sorted(files),
            by=request.get("by"),
            record=request.get("record"),
            client=request.get("client"),
            generation=manifest["generation"],
        )
        table = _table(pending["record"])
        holders = [pending["record"]] if table else []
        atomic_write(Path(root) / INSTALL_RECORD, (json_with(pending, holders, table) + "\n").encode())
        result = _apply(root, pending, manifest, table)
    finally:
        _drop_stage(root, stage)
    return result


def finish_pending(root: str) -> None:
    """Finish the install whose record is there (its files are staged and durable; its renames may have begun):
    by whoever holds the push lock, before anything reads the queue. Each step is done again only where it is
    not done yet, so an install killed while it was finished is finished by the next one."""
    path = os.path.join(root, INSTALL_RECORD)
    if not os.path.lexists(path):
        return
    pending = read_json_or_none(path)
    if not _a_record(pending):
        os.unlink(path)  # written whole or not at all: never one the installs wrote; nothing was renamed for it
        return
    try:
        _apply(root, pending, read_manifest(root))
    finally:
        _drop_stage(root, os.path.join(root, pending["stage"]))


def _drop_stage(root: str, stage: str) -> None:
    """STAGE removed once no install record is left to finish from it: an install that failed part-way keeps its
    record and its staged files (a staged file missing is read as one that landed), for the next to finish."""
    if not pending_install(root):
        shutil.rmtree(stage, ignore_errors=True)


def _a_record(pending: Any) -> bool:
    """PENDING is an install record: its stage, files and removes name files in one directory, never a path."""
    if not isinstance(pending, dict) or not _plain(pending.get("stage"), STAGE_PREFIX):
        return False
    lists = {key: pending.get(key, []) for key in ("files", "remove", "replace", "resets", "stale", "stop")}
    if not all(isinstance(value, list) for value in lists.values()):
        return False
    removes = lists["remove"]
    return all(_plain(name) for name in lists["files"]) and all(
        isinstance(r, list) and len(r) == 2 and r[0] in STATES and _plain(r[1]) for r in removes
    )


def _plain(name: Any, prefix: str = "") -> bool:
    """NAME is a file's name in one directory (a record names no path), starting with PREFIX."""
    return isinstance(name, str) and name.startswith(prefix) and "/" not in name and name not in ("", ".", "..")


def _apply(root: str, pending: dict[str, Any], manifest: dict[str, Any], table: str | None = None) -> dict[str, Any]:
    """What a pending install does after its files are staged: removes, resets, stale marks, the renames, stop
    requests, the manifest (once: unless a manifest past the record's generation is there), then the record
    removed."""
    result: dict[str, Any] = {"installed": [], "removed": [], "gone": []}
    _reset_and_remove(root, pending, result)
    # Before the files land: a stale job (and what follows it) must not be taken as done meanwhile.
    stamps.mark_stale(root, pending.get("stale", []))
    stage = os.path.join(root, pending["stage"])
    _land(root, stage, pending.get("files", []), set(pending.get("replace", [])), result)
    _stop(root, pending, result)
    if manifest["generation"] == pending.get("generation", manifest["generation"]) and (
        pending.get("record") is not None
        or result["installed"]
        or result["removed"]
        or pending.get("resets")
        or pending.get("stale")
    ):
        # Every install that changed something moves the generation, so a push that looked before it is refused.
        record: Any = pending.get("record")
        manifest = _record(manifest, record, pending.get("take_over", []), pending.get("client"))
        table = table or _table(record)  # the plan's jobs: in its entry, and the union where it is all of it
        holders = [manifest["plans"][record["plan"]]] if table else []
        if holders and manifest["jobs"] == record["jobs"]:
            holders.append(manifest)
        # compact, so the C encoder writes it (indented, 10 000 jobs took 6x as long: most of an install's CPU)
        atomic_write(Path(root) / "manifest.json", (json_with(manifest, holders, table, True) + "\n").encode())
    # The stage before the record: an install killed between the two is finished by the next one (each staged file
    # read as landed), and none killed after them leaves a stage no record names.
    shutil.rmtree(stage, ignore_errors=True)
    os.unlink(os.path.join(root, INSTALL_RECORD))
    fsync_dir(Path(root))
    result["generation"] = manifest["generation"]
    return result


def _table(record: Any) -> str | None:
    """The jobs table of a plan's RECORD as JSON, sorted as manifest.json holds it; None where there is none."""
    jobs = record.get("jobs") if isinstance(record, dict) and isinstance(record.get("plan"), str) else None
    return json.dumps(jobs, sort_keys=True) if isinstance(jobs, dict) and jobs else None


def _stage(root: str, stage: str, files: dict[str, str]) -> None:
    """Every new job file written in full beside queue/, then all made durable with one barrier (one syncfs, not
    an fsync per file), before any lands: a crash leaves each landed job whole."""
    # With the queue's file mode (0600, 0660 shared) whatever the umask: each keeps it as it lands there.
    mode = file_mode(os.path.join(root, "queue"))
    write_all_durably(stage, [(name, text.encode("utf-8")) for name, text in sorted(files.items())], mode)


def _reset_and_remove(root: str, request: dict[str, Any], result: dict[str, Any]) -> None:
    for name in request.get("resets", []):
        atomic_write(Path(root) / "control" / request_name("reset", name), b"{}\n")
    for state, name in request.get("remove", []):
        try:
            os.unlink(os.path.join(root, state, name))
            result["removed"].append([state, name])
        except FileNotFoundError:
            result["gone"].append([state, name])


def _stop(root: str, request: dict[str, Any], result: dict[str, Any]) -> None:
    """--stop-retired: a cancel request for each retired running job, carried out by the runner as `plan cancel`."""
    body = (json.dumps({"by": f"{request.get('by') or '?'} (push --stop-retired)"}) + "\n").encode()
    for name in request.get("stop", []):
        atomic_write(Path(root) / "control" / request_name("cancel", name), body)
        result.setdefault("stopping", []).append(name)


def _land(root: str, stage: str, files: list[str], replacing: set[str], result: dict[str, Any]) -> None:
    """The staged files renamed into queue/: each appears whole or not at all."""
    queue = os.path.join(root, "queue")
    where: list[int] = []  # the two directories' descriptors: renamed by them, not by paths (10 000: 45 ms less)
    try:
        for directory in (stage, queue):
            where.append(os.open(directory, os.O_RDONLY))
    except OSError:
        pass  # the stage gone (all of it landed) or no queue/: renamed by paths, each file told apart as below
    by_fd = len(where) == 2 and os.replace in os.supports_dir_fd
    try:
        installed = result["installed"]
        for name in sorted(files):
            staged = os.path.join(stage, name)
            if name in replacing and not os.path.exists(os.path.join(queue, name)) and os.path.lexists(staged):
                # The runner started the old version after the diff was made: do not queue it a second time.
                result["gone"].append(["queue", name])
                continue
            try:
                if by_fd:
                    os.replace(name, name, src_dir_fd=where[0], dst_dir_fd=where[1])
                else:
                    os.replace(staged, os.path.join(queue, name))
            except FileNotFoundError:
                if os.path.lexists(staged) or not os.path.isdir(queue):
                    raise
                # landed before the install that staged it was killed (no stat per file when none was)
            installed.append(name)
    finally:
        for fd in where:
            os.close(fd)
    if result["installed"]:
        fsync_dir(Path(root) / "queue")  # the renames durable before the manifest names the new generation


def _record(
    manifest: dict[str, Any], record: dict[str, Any] | None, take_over: list[str], writer: Any = None
) -> dict[str, Any]:
    """The next manifest: RECORD (if any) as its plan's entry, TAKE_OVER jobs removed from other plans, unions
    rebuilt, generation + 1."""
    plans = {name: dict(entry) for name, entry in manifest["plans"].items() if isinstance(entry, dict)}
    moved = set(take_over)
    for name, entry in plans.items():
        if moved and (record is None or name != record["plan"]):
            entry["jobs"] = {job: spec for job, spec in (entry.get("jobs") or {}).items() if job not in moved}
    if record is not None:
        now = time.time()
        entry = {k: v for k, v in record.items() if k != "plan"}
        if isinstance(entry.get("source"), dict):
            entry["source"] = {**entry["source"], "at": now}  # the box's clock, as the probe's `now`
        plans[record["plan"]] = {**entry, "pushed_at": timestamp(now)}
    jobs, producers, external, slots = _unions(plans)
    gpus = _gpus(plans)
    last = record["plan"] if record is not None else manifest.get("plan")
    return {
        "version": MANIFEST_VERSION,
        "written_by": writer if isinstance(writer, dict) else identity(),
        "generation": manifest["generation"] + 1,
        "plan": last,
        "plans": plans,
        "jobs": jobs,
        "producers": producers,
        "external": external,
        **({"slots": slots} if slots else {}),
        **({"gpus": gpus} if gpus else {}),
    }


def _gpus(plans: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    """Lane -> the GPUs it gives its jobs: every one any plan (or its host's entry) names."""
    gpus: dict[str, list[int]] = {}
    for entry in plans.values():
        found = entry.get("gpus")
        for lane, devices in (found if isinstance(found, dict) else {}).items():
            if isinstance(devices, list):
                wanted = gpus.setdefault(lane, [])
                wanted += [d for d in devices if isinstance(d, int) and not isinstance(d, bool) and d not in wanted]
    return {lane: sorted(devices) for lane, devices in gpus.items() if devices}


def _unions(
    plans: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, list[str]], list[str], dict[str, int]]:
    """Every plan's jobs, producers, external paths and lane slots, as the runner reads them in one manifest."""
    jobs: dict[str, Any] = {}
    producers: dict[str, list[str]] = {}
    external: list[str] = []
    slots: dict[str, int] = {}  # lane -> slots, the most any plan (or its host's entry) asked for
    for entry in plans.values():
        jobs.update(entry.get("jobs") or {})
        for lane, count in (entry.get("slots") or {}).items():
            if isinstance(count, int) and count >= 1:
                slots[lane] = max(slots.get(lane, 1), count)
        for path, names in (entry.get("producers") or {}).items():
            producers.setdefault(path, [])
            producers[path] += [n for n in names if n not in producers[path]]
        external += [p for p in entry.get("external") or [] if p not in external]
    return jobs, producers, external, slots
