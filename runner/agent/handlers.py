"""The agent's queue handlers: status (the window of events, status.json, job counts), park, control, logs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from runner import readers
from runner.controls import PARK_FILE, PARKED_LANES_FILE, park_record, request_name
from runner.errors import AgentError
from runner.files import atomic_write, make_dir, open_regular, read_json, read_json_or_none
from runner.queue import STATES, Queue, fresh_status
from runner.readers import read_events, tail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def counts(root: str) -> dict[str, int]:
    queue = Queue(Path(root))
    return {state: len(queue.jobs(state)) for state in STATES}


def status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    st, corrupt = _read_status(os.path.join(root, "status.json"))
    grouped = bool(request.get("grouped"))  # `plan status` without --all: the waiting jobs grouped, not each sent
    st = fresh_status(root, st, every=not grouped) if st is not None else None
    logs = {}
    now = time.time()
    for run in (st or {}).get("running", []) if isinstance(st, dict) else []:
        path = str(Queue(Path(root)).log_path(run.get("job", "")))
        text, log_size = tail(path, 8192)
        logs[run.get("job")] = {"tail": text, "size": log_size}
        _as_the_log_says(run, path, text, log_size, now)
    if grouped and isinstance(st, dict):
        if "waiting_groups" not in st:  # an older runner's: grouped here
            st = _grouped(st, now)
        st = {k: v for k, v in st.items() if k != "queued_first"}  # `queued` is them
    alive = readers.runner_alive(st)
    if request.get("estimates") and isinstance(st, dict):  # asked for by `plan status` and `plan top`, not watch
        from runner.estimates import from_root

        down = None if alive else "no runner is running: nothing starts until one does"
        estimates: dict[str, Any] = {"estimates": from_root(root, st, now, down)}
    else:
        estimates = {}
    return {
        "status": st,
        **read_events(root, request),
        "logs": logs,
        "counts": counts(root),
        "runner_alive": alive,
        # a runner that is not running stopped cleanly (when and why) or died: readers say which
        "runner_stopped": None if alive else readers.runner_stopped(root, st),
        "now": now,
        "parked": read_json_or_none(os.path.join(root, PARK_FILE)),
        "incidents": read_json_or_none(os.path.join(root, "incidents.json")),  # the book (runner.alerts.book)
        "zone": readers.box_zone(),
        "parked_lanes": read_json_or_none(os.path.join(root, PARKED_LANES_FILE)),
        **({"status_error": corrupt} if corrupt else {}),
        **estimates,
    }


def _as_the_log_says(run: dict[str, Any], path: str, text: str, size: int, now: float) -> None:
    """RUN's progress, last line and last growth as its log (TEXT: its tail, SIZE, read now) says: status.json's
    are as old as the runner's last write (up to --tick), and the estimates, `plan status` and `plan top` read
    these. The same lines as the runner reads (runner.logs.lines_of); the growth is the file's mtime where it grew
    since the runner looked. `progress_at`: when a progress line was read (its estimate's elapsed time counts to
    then)."""
    from runner.logs import lines_of
    from runner.progress import parse_progress

    lines = lines_of(text)
    progress = parse_progress("\n".join(lines[-20:]))
    run.pop("progress", None)
    if progress:
        run["progress"], run["progress_at"] = progress, now
    if lines:
        run["last_line"] = lines[-1][:300]
    if size != run.get("log_size"):
        try:
            run["log_grew_at"] = max(float(run.get("log_grew_at") or 0), os.stat(path).st_mtime)
        except OSError:
            pass


def _grouped(status: dict[str, Any], now: float) -> dict[str, Any]:
    """STATUS of a runner that lists every waiting job in status.json, with them as a runner now writes them there
    (runner.views.waiting.Summary): 10 000 entries are then neither sent nor read."""
    from runner.views.waiting import Summary

    summary = Summary(now)
    for item in status.get("queued") or []:
        if isinstance(item, dict):
            summary.add(item)
    found = summary.result()
    return {**status, **found, "queued": found["queued_first"]}


def _read_status(path: str) -> tuple[Any, str | None]:
    """status.json's content, or None and why it is unusable: a corrupt file is not a runner that never ran."""
    try:
        st = read_json(Path(path))
    except (OSError, ValueError) as exc:
        return None, f"{path} exists but is not readable JSON ({exc})"
    problem = readers.status_problem(st) if st is not None else None
    return (None, f"{path} exists but is corrupt: {problem}") if problem else (st, None)


def park(root: str, request: dict[str, Any]) -> dict[str, Any]:
    if request.get("lane"):
        return _park_lane(root, str(request["lane"]), request.get("parked"))
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


def _park_lane(root: str, lane: str, parked: dict[str, Any] | None) -> dict[str, Any]:
    """One lane parked alone (or let go): parked-lanes.json, {lane: park_record}, rewritten atomically."""
    path = Path(root) / PARKED_LANES_FILE
    served = _served_lanes(root)
    if parked is not None and served is not None and lane not in served:
        # A typo would park nothing, say "parked" and leave the lane running: the runner's lanes are known
        raise AgentError(f"no lane {lane!r} on this queue: its runner serves {', '.join(sorted(served)) or 'none'}")
    lanes = read_json_or_none(str(path))
    lanes = lanes if isinstance(lanes, dict) else {}
    if parked is None:
        existed = lanes.pop(lane, None) is not None
        if not lanes:
            if path.exists():
                path.unlink()
        elif existed:
            atomic_write(path, (json.dumps(lanes) + "\n").encode())
        return {"unparked": existed, "lane": lane}
    lanes[lane] = park_record(
        str(parked.get("reason", "")),
        str(parked.get("by", "?")),
        str(parked.get("since") or time.strftime("%Y-%m-%d %H:%M:%S")),
    )
    atomic_write(path, (json.dumps(lanes) + "\n").encode())
    return {"parked": lanes[lane], "lane": lane}


def _served_lanes(root: str) -> set[str] | None:
    """The lanes the root's runner serves, from its status.json; None when no runner has said (not started yet,
    or its status unreadable): a lane may be parked before its runner starts."""
    st = read_json_or_none(os.path.join(root, "status.json"))
    lanes = st.get("lanes") if isinstance(st, dict) else None
    return set(lanes) if isinstance(lanes, dict) and lanes else None


def _drop_request(root: str, name: str, by: str, body: dict[str, Any] | None = None) -> str:
    control = os.path.join(root, "control")
    make_dir(control)
    path = os.path.join(control, name)
    atomic_write(Path(path), json.dumps({**(body or {}), "by": by}).encode())
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
        raise AgentError(str(exc)) from None
    before = where(root, job)
    body: dict[str, Any] = {k: str(request[k]) for k in ("to", "other") if k in request}  # a move's
    path = _drop_request(root, name, str(request.get("by", "?")), body)
    answer = {**_taken(root, path, float(request.get("wait_s", 30))), "before": before, "after": where(root, job)}
    if "other" in request:  # a move before another job: where that one is
        answer["other"] = where(root, str(request["other"]))
    return answer


def ack(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """`plan ack`: the open incidents of the book that TARGET names, and a control request for the runner to
    silence them (on every channel); waits (bounded) until it is taken. Nothing is asked when nothing matches."""
    import hashlib

    from runner.alerts.book import BOOK_FILE, Incident, matching

    target, until = str(request.get("target", "")), request.get("until")
    raw = read_json_or_none(os.path.join(root, BOOK_FILE))
    items = raw.get("open") if isinstance(raw, dict) else None
    open_ = [i for i in (Incident.load(x) for x in items or []) if i is not None]
    found = matching(open_, target)
    shown = [{"id": i.id, "kind": i.kind, "text": i.text} for i in found]
    if not found:
        return {"matched": [], "open": [i.id for i in open_]}
    token = hashlib.sha1(os.fsencode(f"{target}:{time.time()}:{os.getpid()}")).hexdigest()[:12]
    path = os.path.join(root, "control", request_name("ack", token))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"by": str(request.get("by", "?")), "target": target, "until": until}
    atomic_write(Path(path), json.dumps(body).encode())
    return {"matched": shown, **_taken(root, path, float(request.get("wait_s", 30)))}


def _taken(root: str, path: str, wait_s: float) -> dict[str, Any]:
    """Whether the runner took the request at PATH within WAIT_S. Where no runner holds the root's lock, at once:
    the request stays, for the next runner to carry out (a hold or a move asked before the runner starts waited
    the whole 30 s, failed, and was then carried out without a word)."""
    from runner.agent.detach import serving

    deadline = time.time() + wait_s
    while os.path.exists(path):
        if serving(root) is None and os.path.exists(path):
            return {"taken": False, "no_runner": True}
        if time.time() >= deadline:
            return {"taken": False}
        time.sleep(0.05)
    return {"taken": True}


def logs(root: str, request: dict[str, Any]) -> dict[str, Any]:
    job = str(request["job"])
    if "/" in job or job.startswith("."):
        raise AgentError(f"bad job name {job!r}")
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
    from runner.slurm import agent as slurm_agent

    view = slurm_agent.status(root, request)  # ControllerDown: answered by runner.agent.dispatch
    return {**view, **read_events(root, request), "logs": {}, "parked": None}
