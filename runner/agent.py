"""`python3 -m runner agent MODE ROOT`: the host side of `plan` (push, status, watch, park, logs...), JSON in and out.

The workstation runs it over ssh (or locally) from the runner package it ships, so it reads and writes the
queue only through runner.jobfile, runner.queue and runner.controls. It exits 0 whenever it ran and reports a
queue it cannot read as {"error": ...}: "could not reach", "the remote command failed" and "the queue says X"
never mix. MODE `session` answers one JSON request per line until stdin ends (a push holds its lock so).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict

from runner import bootstrap, delivery, pushlock, readers
from runner.controls import PARK_FILE, park_record, request_name
from runner.files import atomic_write, open_regular, read_json, read_json_or_none
from runner.queue import STATES, Queue, fresh_status

Handler = Callable[[str, Dict[str, Any]], Dict[str, Any]]  # typing's: evaluated at run time on 3.8


def tail(path: str, limit: int) -> tuple[str, int]:
    """The last LIMIT bytes of PATH as text, and its size."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace"), size
    except OSError:
        return "", 0


def read_events(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """A window of events.jsonl: from `offset` (a watcher's place; a rotated file is read from 0), or its tail."""
    events_path = os.path.join(root, "events.jsonl")
    offset = int(request.get("offset", -1))
    try:
        size = os.path.getsize(events_path)
    except OSError:
        size = 0
    events: list[Any] = []
    new_offset, rotated = size, False
    if offset >= 0:
        # A file truncated or replaced since the last probe starts with other bytes: read it all.
        if offset > size or (request.get("head") and offset > 0 and request["head"] != _head(events_path, offset)):
            offset, rotated = 0, True
        data = b""
        if size:
            try:
                with open_regular(events_path) as handle:
                    handle.seek(offset)
                    data = handle.read(int(request.get("max_bytes", 1 << 20)))
            except OSError:  # no regular file: nothing to read, never a probe that blocks
                pass
        cut = data.rfind(b"\n") + 1
        new_offset = offset + cut
        lines = data[:cut].split(b"\n")[:-1]
        at = offset
    else:
        limit = int(request.get("tail_bytes", 16384))
        text, _ = tail(events_path, limit)
        lines = [ln.encode() for ln in (text.splitlines()[1:] if len(text) >= limit else text.splitlines())]
        at = max(0, size - sum(len(ln) + 1 for ln in lines))
    skipped: list[str] = []
    for line in lines:
        # A malformed line is skipped and named by its byte offset, so the watcher's offset still advances.
        try:
            event: Any = json.loads(line)
            problem = readers.event_problem(event)
        except ValueError:
            problem = "not JSON"
        if problem is None:
            events.append(event)
        elif line.strip():
            skipped.append(f"events.jsonl line {_line_at(events_path, at)}: {problem}")
        at += len(line) + 1
    head = _head(events_path, new_offset) if new_offset else ""
    return {"events": events, "offset": new_offset, "rotated": rotated, "head": head, "skipped": skipped}


def _line_at(path: str, offset: int) -> int:
    """The line number of the line that starts at byte OFFSET: counted only for a malformed line, which is
    said once, so a healthy probe never reads the whole file."""
    count = 1
    try:
        with open_regular(path) as handle:
            while offset > 0:
                chunk = handle.read(min(offset, 1 << 20))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                offset -= len(chunk)
    except OSError:
        pass
    return count


def _head(path: str, offset: int) -> str:
    """The fingerprint of the file's first bytes up to OFFSET (at most 256): a file still shorter than 256
    bytes keeps the one a watcher stored as it grows; a rotated one has another."""
    try:
        with open_regular(path) as handle:
            return hashlib.sha256(handle.read(min(256, offset))).hexdigest()[:16]
    except OSError:
        return ""


def counts(root: str) -> dict[str, int]:
    queue = Queue(Path(root))
    return {state: len(queue.jobs(state)) for state in STATES}


def status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    st, corrupt = _read_status(os.path.join(root, "status.json"))
    st = fresh_status(root, st) if st is not None else None
    logs = {}
    for run in (st or {}).get("running", []) if isinstance(st, dict) else []:
        text, log_size = tail(str(Queue(Path(root)).log_path(run.get("job", ""))), 8192)
        logs[run.get("job")] = {"tail": text, "size": log_size}
    return {
        "status": st,
        **read_events(root, request),
        "logs": logs,
        "counts": counts(root),
        "runner_alive": delivery.runner_alive(st),
        "now": time.time(),
        "parked": read_json_or_none(os.path.join(root, PARK_FILE)),
        **({"status_error": corrupt} if corrupt else {}),
    }


def _read_status(path: str) -> tuple[Any, str | None]:
    """status.json's content, or None and why it is unusable: a corrupt file is not a runner that never ran."""
    try:
        st = read_json(Path(path))
    except (OSError, ValueError) as exc:
        return None, f"{path} exists but is not readable JSON ({exc})"
    problem = readers.status_problem(st) if st is not None else None
    return (None, f"{path} exists but is corrupt: {problem}") if problem else (st, None)


def park(root: str, request: dict[str, Any]) -> dict[str, Any]:
    path = Path(root) / PARK_FILE
    parked = request.get("parked")
    if parked is None:
        existed = path.exists()
        if existed:
            path.unlink()
        return {"unparked": existed}
    record = park_record(
        str(parked.get("reason", "")),
        str(parked.get("by", "?")),
        str(parked.get("since") or time.strftime("%Y-%m-%d %H:%M:%S")),
    )
    atomic_write(path, (json.dumps(record) + "\n").encode())
    if request.get("requeue_running"):
        _drop_request(root, request_name("requeue", "running"), record["by"])
    return {"parked": record}


def _drop_request(root: str, name: str, by: str) -> str:
    control = os.path.join(root, "control")
    os.makedirs(control, exist_ok=True)
    path = os.path.join(control, name)
    atomic_write(Path(path), json.dumps({"by": by}).encode())
    return path


def where(root: str, job: str) -> str | None:
    for state in STATES:
        if os.path.exists(os.path.join(root, state, job)):
            return state
    return None


def control(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Drop a request for the runner and wait (bounded) until it has been taken."""
    job, action = str(request["job"]), str(request["action"])
    try:
        name = request_name(action, job)
    except ValueError as exc:
        return {"error": str(exc)}
    before = where(root, job)
    path = _drop_request(root, name, str(request.get("by", "?")))
    deadline = time.time() + float(request.get("wait_s", 30))
    while time.time() < deadline and os.path.exists(path):
        time.sleep(0.05)
    return {"taken": not os.path.exists(path), "before": before, "after": where(root, job)}


def logs(root: str, request: dict[str, Any]) -> dict[str, Any]:
    job = str(request["job"])
    if "/" in job or job.startswith("."):
        return {"error": f"bad job name {job!r}"}
    path = str(Queue(Path(root)).log_path(job))
    state = where(root, job)
    offset = int(request.get("offset", -1))
    try:
        size = os.path.getsize(path)
    except OSError:
        return {"state": state, "text": "", "offset": 0, "exists": False}
    if offset < 0:
        text, size = tail(path, int(request.get("max_bytes", 65536)))
        lines = text.splitlines()[-int(request.get("lines", 40)) :]
        return {"state": state, "text": "\n".join(lines) + ("\n" if lines else ""), "offset": size, "exists": True}
    if offset > size:
        offset = 0
    try:
        with open_regular(path) as handle:
            handle.seek(offset)
            data = handle.read(int(request.get("max_bytes", 1 << 20)))
    except OSError:  # gone since, or no regular file (a FIFO would block here)
        data = b""
    return {"state": state, "text": data.decode("utf-8", "replace"), "offset": offset + len(data), "exists": True}


def slurm_status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """squeue as a status answer, with the events window read exactly as for a queue host."""
    from runner import slurm_agent

    view = slurm_agent.status(root, request)
    if "controller_down" in view:
        return view
    return {**view, **read_events(root, request), "logs": {}, "parked": None}


QUEUE_HANDLERS: dict[str, Handler] = {
    "probe": delivery.probe,
    "lock": pushlock.lock,
    "install": delivery.install,
    "status": status,
    "park": park,
    "control": control,
    "logs": logs,
    "bootstrap": bootstrap.bootstrap,
}


def slurm_handlers() -> dict[str, Handler]:
    """The Slurm backend's handlers, imported only when a request names it (a queue host never loads them)."""
    from runner import slurm_agent

    return {"push": slurm_agent.push, "status": slurm_status, "history": slurm_agent.history, "logs": slurm_agent.logs}


def answer(mode: str, root: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request: the backend named in it picks the handler; any failure is reported as a value."""
    root = os.path.expanduser(root)
    if os.path.lexists(root) and not os.path.isdir(root):
        return {"error": f"no queue at {root} ({root} is not a directory)"}
    if not os.path.isdir(root) and not request.get("create") and not request.get("allow_missing"):
        return {"error": f"no queue at {root} (the directory does not exist)"}
    backend = request.get("backend") or "queue"
    handlers = slurm_handlers() if backend == "slurm" else QUEUE_HANDLERS
    handler = handlers.get(mode)
    if handler is None:
        return {"error": f"the {backend} backend has no {mode!r} request"}
    try:
        return handler(root, request)
    except OSError as exc:  # the queue's own files: a root under a file, no permission, a full disk
        where = f" ({exc.filename})" if exc.filename else ""
        return {"error": f"{exc.strerror or exc}{where}"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def session(root: str) -> int:
    """One request per stdin line, one answer per stdout line; locks taken here are released when stdin ends."""
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            sys.stdout.write(json.dumps(answer(str(request.pop("mode", "")), root, request)) + "\n")
            sys.stdout.flush()
    finally:
        pushlock.release_lock()
    return 0


def main(argv: list[str]) -> int:
    """MODE ROOT; the request is JSON on stdin (one per line for `session`)."""
    if len(argv) != 2:
        sys.stderr.write("usage: python3 -m runner agent MODE ROOT  (JSON request on stdin)\n")
        return 2
    mode, root = argv
    if mode == "session":
        return session(root)
    raw = sys.stdin.read()
    try:
        request = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        sys.stdout.write(json.dumps({"error": f"the request is not JSON: {exc}"}))
        return 0
    try:
        sys.stdout.write(json.dumps(answer(mode, root, request)))
    finally:
        pushlock.release_lock()
    return 0
