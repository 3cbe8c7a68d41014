"""`plan bootstrap HOST --start` on the host: the runner started detached where no systemd runs (its own session,
its own log, the unit's flags), at most once per root; and how the runner serving a root was started."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import runner as runner_package
from runner.files import read_json_or_none
from runner.queue import fresh_status, timestamp

LOG_NAME = "runner.log"  # under ROOT/.plan-runner/


def serving(root: str) -> int | None:
    """The pid of the runner holding ROOT/.runner.lock (one runner per root), or None when none holds it."""
    path = os.path.join(root, ".runner.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def start(root: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """Start `python3 -m runner run --root ROOT FLAGS` from ROOT/.plan-runner in a session of its own, output to
    ROOT/.plan-runner/runner.log; unless a runner already serves ROOT. Waits up to `wait_s` for its heartbeat."""
    lib = os.path.join(root, ".plan-runner")
    holder = serving(root)
    status = fresh_status(root, read_json_or_none(os.path.join(root, "status.json"))) or {}
    runner: dict[str, Any] = status["runner"] if isinstance(status.get("runner"), dict) else {}
    if holder is not None:
        how = runner.get("started_by") if runner.get("pid") == holder else None
        return {"already": holder, "how": how or "unknown"}
    flags: Sequence[str] = [str(f) for f in request.get("flags") or []]
    argv = [str(request.get("python") or "python3"), "-u", "-m", "runner", "run", "--root", root, *flags]
    os.makedirs(lib, exist_ok=True)
    log_path = os.path.join(lib, LOG_NAME)
    env = dict(os.environ, PYTHONPATH=lib)
    env[runner_package.STARTED_ENV] = (
        f"plan bootstrap --start by {request.get('by') or '?'} at {timestamp(time.time())}"
    )
    started = time.time()
    with open(log_path, "ab") as log:
        log.write(f"--- {timestamp(started)} starting: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: no hangup when the ssh session that started it ends
            close_fds=True,
        )
    done: dict[str, Any] = {"started": proc.pid, "log": log_path, "command": argv, "heartbeat": False}
    deadline = started + float(request.get("wait_s", 30))
    while time.time() < deadline:
        if proc.poll() is not None:
            holder = serving(root)
            if proc.returncode == 3 and holder is not None:  # another start won the root's lock meanwhile
                return {"already": holder, "how": "at the same time as this one"}
            done["exited"] = proc.returncode
            done["log_tail"] = _tail(log_path)
            return done
        beat = fresh_status(root, read_json_or_none(os.path.join(root, "status.json"))) or {}
        if (beat.get("runner") or {}).get("pid") == proc.pid:
            done["heartbeat"] = True
            break
        time.sleep(0.1)
    return done


def _tail(path: str, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
