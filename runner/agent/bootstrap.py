"""`plan bootstrap` on the host: the runner package copied under ROOT/.plan-runner, its systemd unit written
and started where systemd runs (else the command to start it by hand)."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from runner.agent import detach
from runner.agent.unit import run_flags
from runner.files import atomic_write, make_dir, read_json_or_none
from runner.queue import Queue, fresh_status


def bootstrap(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Copy the runner package under ROOT/.plan-runner, write its systemd unit, start it if systemd runs."""
    done: dict[str, Any] = {"written": [], "unchanged": [], "commands": [], "systemd": False, "heartbeat": False}
    lib = os.path.join(root, ".plan-runner")
    Queue(Path(root)).ensure()
    _copy_runner(lib, request, done)
    user_unit = bool(request.get("user_unit"))
    unit_dir = os.path.expanduser("~/.config/systemd/user") if user_unit else "/etc/systemd/system"
    unit_path = os.path.join(unit_dir, request["unit_name"])
    done["unit_path"] = unit_path
    flags = [str(f) for f in request.get("flags") or run_flags()]
    run = " ".join(
        shlex.quote(w)
        for w in [f"PYTHONPATH={lib}", request.get("python", "python3"), "-u", "-m", "runner", "run", "--root", root]
    )
    run += "".join(f" {shlex.quote(f)}" for f in flags)
    has_systemd = shutil.which("systemctl") is not None and os.path.isdir("/run/systemd/system")
    try:
        os.makedirs(unit_dir, exist_ok=True)
        atomic_write(Path(unit_path), request["unit"].encode())
        done["written"].append(unit_path)
    except OSError as exc:
        done["unit_error"] = str(exc)
    if not has_systemd:
        if request.get("start"):
            done["start"] = detach.start(root, {**request, "flags": flags})
            return done
        holder = detach.serving(root)
        if holder is not None:
            done["commands"] = [f"# a runner (pid {holder}) already serves {root}"]
        else:
            done["commands"] = [
                "# systemd is not running here: `plan bootstrap HOST --start` starts the runner detached, or run:",
                run,
            ]
        return done
    done["systemd"] = True
    if _start_unit(root, request, user_unit, done) and user_unit:
        done["commands"].append("# a --user unit stops at logout unless lingering is on: loginctl enable-linger $USER")
    return done


def _copy_runner(lib: str, request: dict[str, Any], done: dict[str, Any]) -> None:
    """The runner's files under LIB, each rewritten only where it differs."""
    for rel, text in sorted(request["files"].items()):
        path = Path(lib) / rel
        at = lib
        for part in ("", *Path(rel).parent.parts):  # LIB and each directory down to the file's, 0700
            at = os.path.join(at, part) if part else at
            make_dir(at)
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
        st = fresh_status(root, read_json_or_none(os.path.join(root, "status.json"))) or {}
        if float(st.get("runner", {}).get("heartbeat", 0)) >= started:
            done["heartbeat"] = True
            break
        time.sleep(0.5)
    return True
