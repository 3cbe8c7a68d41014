"""The host side of `plan push` and `plan bootstrap`: probe, the push lock, install with compare-and-swap.

manifest.json records every plan that pushed to the root (contract 2): `plans` maps each plan's name to the
jobs it owns, its hash, when and by whom; `jobs`, `producers` and `external` are their union, which is what
the runner reads for `blocked`; `generation` counts installs, and an install names the generation it diffed
against, so a push that looked at an older queue is refused instead of mixing two versions.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from runner import jobfile, stamps
from runner.controls import request_name
from runner.queue import STATES, Queue, atomic_write, fresh_status, read_json, timestamp

STAGE_PREFIX = ".plan-stage-"
STAGE_MAX_AGE_S = 3600.0  # a staging dir this old belongs to a push that died: anyone may remove it
LOCK_NAME = ".push.lock"
MANIFEST_VERSION = 2

_held: dict[str, int] = {}  # root -> fd of its push lock, held by this process
# root -> the topmost directory lock() created for it: removed again, if still empty, by a push that
# never installed (a refused push leaves the host as it found it)
_created: dict[str, str] = {}


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return "?"


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
    return {
        "generation": generation if isinstance(generation, int) else 0,
        "plans": plans,
        "plan": raw.get("plan") if isinstance(raw.get("plan"), str) else None,
    }


def owners(manifest: dict[str, Any]) -> dict[str, str]:
    """Job file name -> the plan that owns it, from manifest.json."""
    found: dict[str, str] = {}
    for plan, record in manifest["plans"].items():
        for name in (record.get("jobs") or {}) if isinstance(record, dict) else {}:
            found[name] = plan
    return found


def _header_plan(name: str, data: bytes, lanes: list[str]) -> str | None:
    """The PLAN= header as the runner reads it (runner.jobfile.parse); None for a hand-written or invalid job."""
    parsed = jobfile.parse(name, data, lanes)
    return parsed.plan if isinstance(parsed, jobfile.JobFile) else None


def runner_alive(status: Any) -> bool:
    """Whether the pid in status.json is a live runner process on this host."""
    runner = status.get("runner") if isinstance(status, dict) else None
    pid = runner.get("pid") if isinstance(runner, dict) else None
    if not isinstance(pid, int):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"runner" in handle.read()
    except OSError:
        return False


def _lifecycle(root: str) -> dict[str, Any] | None:
    """The last runner-start or runner-stop in the tail of events.jsonl."""
    try:
        with open(os.path.join(root, "events.jsonl"), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - 65536))
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b"runner-st" not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in ("runner-start", "runner-stop"):
            return event
    return None


def probe(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """What a push diffs against: each job file's hash and owning plan, manifest generation, runner health."""
    status = fresh_status(root, _read(os.path.join(root, "status.json")))
    lanes = list(jobfile.DEFAULT_LANES)
    if isinstance(status, dict) and isinstance(status.get("lanes"), dict):
        lanes += [lane for lane in status["lanes"] if lane not in lanes]
    queue = Queue(Path(root))
    files: dict[str, dict[str, Any]] = {}
    for state in STATES:
        entries = {}
        for name in queue.jobs(state):
            try:
                with open(os.path.join(root, state, name), "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            entries[name] = {"sha": hashlib.sha256(data).hexdigest(), "plan": _header_plan(name, data, lanes)}
        files[state] = entries
    manifest = read_manifest(root)
    missing = [p for p in request.get("external", []) if not os.path.exists(p.rstrip("/") or "/")]
    found, torn = stamps.read_all(root)
    return {
        "files": files,
        "external_missing": missing,
        "status": status,
        "runner_alive": runner_alive(status),
        "lifecycle": _lifecycle(root),
        "parked": _read(os.path.join(root, "parked.json")),
        "generation": manifest["generation"],
        "owners": owners(manifest),
        "plans": {
            name: {k: v for k, v in record.items() if k in ("hash", "pushed_at", "by")}
            for name, record in manifest["plans"].items()
            if isinstance(record, dict)
        },
        "stamps": found,
        "stamp_problems": {name: [list(p) for p in wrong] for name, wrong in torn.items()},
        "now": time.time(),
    }


def _read(path: str) -> Any:
    try:
        return read_json(Path(path))
    except (OSError, ValueError):
        return None


def lock(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Take ROOT/.push.lock for this process (until it exits), waiting at most `wait_s`."""
    if root in _held:
        return {"locked": True}
    if os.path.lexists(root) and not os.path.isdir(root):
        return {"error": f"{root} is not a directory (a queue root is one)"}
    top = root
    while not os.path.lexists(os.path.dirname(top.rstrip("/")) or "/"):
        top = os.path.dirname(top.rstrip("/"))
    new = not os.path.lexists(root)
    os.makedirs(root, exist_ok=True)
    if new:
        _created[root] = top
    path = os.path.join(root, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + float(request.get("wait_s", 60))
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            holder = _read(path) or {}
            os.close(fd)
            return {"busy": True, "holder": holder if isinstance(holder, dict) else {}}
        time.sleep(0.05)
    holder = {"pid": os.getpid(), "user": request.get("by") or _who(), "since": timestamp(time.time())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    _held[root] = fd
    return {"locked": True}


def release_lock() -> None:
    for root, fd in list(_held.items()):
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the descriptor releases the flock
        del _held[root]
    for root, top in list(_created.items()):
        _remove_unused(root, top)
        del _created[root]


def _remove_unused(root: str, top: str) -> None:
    """A root this process created for a push that never installed: its lock file and the directories up to
    TOP, each only if empty (another push may have put something there meanwhile)."""
    try:
        os.unlink(os.path.join(root, LOCK_NAME))
        path = root.rstrip("/")
        while True:
            os.rmdir(path)
            if path == top.rstrip("/"):
                break
            path = os.path.dirname(path)
    except OSError:
        pass


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
    if root not in _held:
        got = lock(root, {"wait_s": request.get("lock_wait_s", 60), "by": request.get("by")})
        if got.get("busy"):
            return got
    queue = Queue(Path(root))
    _created.pop(root, None)  # a push installs here: the root stays
    queue.ensure()
    (Path(root) / "control").mkdir(exist_ok=True)
    manifest = read_manifest(root)
    expected = request.get("generation")
    if expected is not None and expected != manifest["generation"]:
        return {"changed": True, "generation": manifest["generation"]}
    _clean_stages(root, time.time())
    stage = tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=root)
    result: dict[str, Any] = {"installed": [], "removed": [], "gone": []}
    try:
        files = request.get("files", {})
        _stage(stage, files)
        _reset_and_remove(root, request, result)
        # Before the files land: a stale job (and what follows it) must not be taken as done meanwhile.
        stamps.mark_stale(root, request.get("stale", []))
        _land(root, stage, files, set(request.get("replace", [])), result)
        if (
            request.get("record") is not None
            or result["installed"]
            or result["removed"]
            or request.get("resets")
            or request.get("stale")
        ):
            # Every install that changed something moves the generation, so a push that looked before it is refused.
            manifest = _record(manifest, request.get("record"), request.get("take_over", []))
            atomic_write(Path(root) / "manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
        result["generation"] = manifest["generation"]
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return result


def _stage(stage: str, files: dict[str, str]) -> None:
    """Each new job file written in full (and synced) beside queue/, before any lands."""
    for name, text in sorted(files.items()):
        with open(os.path.join(stage, name), "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())


def _reset_and_remove(root: str, request: dict[str, Any], result: dict[str, Any]) -> None:
    for name in request.get("resets", []):
        atomic_write(Path(root) / "control" / request_name("reset", name), b"{}\n")
    for state, name in request.get("remove", []):
        try:
            os.unlink(os.path.join(root, state, name))
            result["removed"].append([state, name])
        except FileNotFoundError:
            result["gone"].append([state, name])


def _land(root: str, stage: str, files: dict[str, str], replacing: set[str], result: dict[str, Any]) -> None:
    """The staged files renamed into queue/: each appears whole or not at all."""
    for name in sorted(files):
        target = os.path.join(root, "queue", name)
        if name in replacing and not os.path.exists(target):
            # The runner started the old version after the diff was made: do not queue it a second time.
            result["gone"].append(["queue", name])
            continue
        os.replace(os.path.join(stage, name), target)
        result["installed"].append(name)


def _record(manifest: dict[str, Any], record: dict[str, Any] | None, take_over: list[str]) -> dict[str, Any]:
    """The next manifest: RECORD (if any) as its plan's entry, TAKE_OVER jobs removed from other plans, unions
    rebuilt, generation + 1."""
    plans = {name: dict(entry) for name, entry in manifest["plans"].items() if isinstance(entry, dict)}
    moved = set(take_over)
    for name, entry in plans.items():
        if moved and (record is None or name != record["plan"]):
            entry["jobs"] = {job: spec for job, spec in (entry.get("jobs") or {}).items() if job not in moved}
    if record is not None:
        plans[record["plan"]] = {
            **{k: v for k, v in record.items() if k != "plan"},
            "pushed_at": timestamp(time.time()),
        }
    jobs, producers, external, slots = _unions(plans)
    last = record["plan"] if record is not None else manifest.get("plan")
    return {
        "version": MANIFEST_VERSION,
        "generation": manifest["generation"] + 1,
        "plan": last,
        "plans": plans,
        "jobs": jobs,
        "producers": producers,
        "external": external,
        **({"slots": slots} if slots else {}),
    }


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


def bootstrap(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Copy the runner package under ROOT/.plan-runner, write its systemd unit, start it if systemd runs."""
    done: dict[str, Any] = {"written": [], "unchanged": [], "commands": [], "systemd": False, "heartbeat": False}
    lib = os.path.join(root, ".plan-runner")
    _copy_runner(lib, request, done)
    Queue(Path(root)).ensure()
    os.makedirs(os.path.join(root, "control"), exist_ok=True)
    user_unit = bool(request.get("user_unit"))
    unit_dir = os.path.expanduser("~/.config/systemd/user") if user_unit else "/etc/systemd/system"
    unit_path = os.path.join(unit_dir, request["unit_name"])
    done["unit_path"] = unit_path
    run = f"PYTHONPATH={lib} {request.get('python', 'python3')} -u -m runner run --root {root}"
    has_systemd = shutil.which("systemctl") is not None and os.path.isdir("/run/systemd/system")
    try:
        os.makedirs(unit_dir, exist_ok=True)
        atomic_write(Path(unit_path), request["unit"].encode())
        done["written"].append(unit_path)
    except OSError as exc:
        done["unit_error"] = str(exc)
    if not has_systemd:
        done["commands"] = ["# systemd is not running here; start the runner yourself, e.g. under tmux:", run]
        return done
    done["systemd"] = True
    if _start_unit(root, request, user_unit, done) and user_unit:
        done["commands"].append("# a --user unit stops at logout unless lingering is on: loginctl enable-linger $USER")
    return done


def _copy_runner(lib: str, request: dict[str, Any], done: dict[str, Any]) -> None:
    """The runner's files under LIB, each rewritten only where it differs."""
    for rel, text in sorted(request["files"].items()):
        path = Path(lib) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        try:
            same = path.read_bytes() == data
        except OSError:
            same = False
        if same:
            done["unchanged"].append(rel)
        else:
            atomic_write(path, data)
            done["written"].append(rel)
    if request.get("content_hash"):
        # The agent of a workstation shipping this same runner uses this copy instead of uploading its own.
        atomic_write(Path(lib) / "runner.hash", (request["content_hash"] + "\n").encode())


def _start_unit(root: str, request: dict[str, Any], user_unit: bool, done: dict[str, Any]) -> bool:
    """systemctl daemon-reload, enable --now and restart, then wait for a heartbeat; False if systemctl failed."""
    import subprocess

    ctl = ["systemctl", "--user"] if user_unit else ["systemctl"]
    started = time.time()
    for args in (["daemon-reload"], ["enable", "--now", request["unit_name"]], ["restart", request["unit_name"]]):
        proc = subprocess.run(ctl + args, capture_output=True, text=True)
        done["commands"].append(" ".join(ctl + args) + f" -> exit {proc.returncode} {proc.stderr.strip()}")
        if proc.returncode != 0:
            return False
    deadline = time.time() + float(request.get("wait_s", 30))
    while time.time() < deadline:
        st = fresh_status(root, _read(os.path.join(root, "status.json"))) or {}
        if float(st.get("runner", {}).get("heartbeat", 0)) >= started:
            done["heartbeat"] = True
            break
        time.sleep(0.5)
    return True
