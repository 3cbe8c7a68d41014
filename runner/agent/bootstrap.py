"""`plan bootstrap` on the host: the runner package copied under ROOT/.plan-runner, ROOT's systemd unit written
and started where systemd runs (else no unit: the runner started detached, or the command to start it by hand)."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from runner.agent import detach
from runner.agent.unit import UNIT_PREFIX, run_flags, served_root, unit_name
from runner.files import atomic_write, make_dir, read_json_or_none
from runner.queue import Queue, fresh_status

# Where systemd runs, /run/systemd/system exists (sd_booted(3)); where units go. Read at each call: tests point
# them at their own directories, never at this machine's.
SYSTEMD_RUNNING = "/run/systemd/system"
UNIT_DIRS = {"system": "/etc/systemd/system", "user": "~/.config/systemd/user"}


def bootstrap(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Copy the runner package under ROOT/.plan-runner; where systemd runs, write ROOT's own unit and start it;
    elsewhere no unit is written: the runner is started detached (`start`) or the command to start it is said."""
    done: dict[str, Any] = {"written": [], "unchanged": [], "commands": [], "systemd": False, "heartbeat": False}
    lib = os.path.join(root, ".plan-runner")
    Queue(Path(root)).ensure()
    _copy_runner(lib, request, done)
    user_unit = bool(request.get("user_unit"))
    flags = [str(f) for f in request.get("flags") or run_flags()]
    run = " ".join(
        shlex.quote(w)
        for w in [f"PYTHONPATH={lib}", request.get("python", "python3"), "-u", "-m", "runner", "run", "--root", root]
    )
    run += "".join(f" {shlex.quote(f)}" for f in flags)
    missing = _no_systemd(user_unit)
    if missing is not None:
        done["no_systemd"] = missing
        if request.get("start"):
            done["start"] = detach.start(root, {**request, "flags": flags})
            return done
        holder = detach.serving(root)
        if holder is not None:
            done["commands"] = [f"# a runner (pid {holder}) already serves {root}"]
        else:
            done["commands"] = [
                "# `plan bootstrap HOST --start` starts the runner detached, or run:",
                run,
            ]
        return done
    done["systemd"] = True
    unit_dir = os.path.expanduser(UNIT_DIRS["user" if user_unit else "system"])
    done["unit_name"], done["unit_path"], error = place_unit(unit_dir, root, request["unit"])
    if error:
        done["unit_error"] = error
        return done
    done["written"].append(done["unit_path"])
    if not _start_unit(root, done["unit_name"], user_unit, request, done):
        done["unit_error"] = "systemctl failed (above): the unit was written, the runner not started"
    elif user_unit:
        done["commands"].append("# a --user unit stops at logout unless lingering is on: loginctl enable-linger $USER")
    return done


def _no_systemd(user_unit: bool) -> str | None:
    """Why no unit can be started here: "system" where systemd is not running (or has no systemctl), "user" where
    a --user unit is asked and this login has no user manager to take it (no $XDG_RUNTIME_DIR/systemd/private: a
    login without pam_systemd, such as sshd with UsePAM no, and no lingering); None where a unit can be started."""
    if shutil.which("systemctl") is None or not os.path.isdir(SYSTEMD_RUNNING):
        return "system"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if user_unit and not (runtime and os.path.exists(os.path.join(runtime, "systemd", "private"))):
        return "user"
    return None


def place_unit(unit_dir: str, root: str, text: str) -> tuple[str, str, str | None]:
    """ROOT's unit TEXT written under UNIT_DIR: its name, its path, and why it was not written (None when it was).
    A unit of that name that serves another root, or that plan did not write, is left as it is."""
    name = _unit_name(unit_dir, root)
    path = os.path.join(unit_dir, name)
    other = _serves_another(path, root)
    if other is not None:
        return name, path, f"it serves {other}: not replaced (remove it by hand if that root is gone)"
    try:
        os.makedirs(unit_dir, exist_ok=True)
        atomic_write(Path(path), text.encode())
    except OSError as exc:
        return name, path, f"not written: {exc.strerror or exc}"
    return name, path, None


def _unit_name(unit_dir: str, root: str) -> str:
    """ROOT's unit: plan-runner.service where an earlier bootstrap wrote that one for ROOT (before units were
    named per root: a second unit would run a second runner, refused the root's lock every 15 s), else its own."""
    try:
        with open(os.path.join(unit_dir, UNIT_PREFIX + ".service"), encoding="utf-8", errors="replace") as old:
            if _same_root(served_root(old.read()), root):
                return UNIT_PREFIX + ".service"
    except OSError:
        pass
    return unit_name(root)


def _serves_another(path: str, root: str) -> str | None:
    """What the unit at PATH serves when that is not ROOT ("ROOT2", or "a unit plan did not write"); None when
    there is none or it is ROOT's."""
    try:
        with open(path, encoding="utf-8", errors="replace") as unit:
            served = served_root(unit.read())
    except FileNotFoundError:
        return None
    if _same_root(served, root):
        return None
    return "a unit plan bootstrap did not write" if served is None else f"another root, {served}"


def _same_root(served: str | None, root: str) -> bool:
    return served is not None and os.path.normpath(os.path.expanduser(served)) == os.path.normpath(root)


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


def _start_unit(root: str, name: str, user_unit: bool, request: dict[str, Any], done: dict[str, Any]) -> bool:
    """systemctl daemon-reload, enable --now and restart, then wait for a heartbeat; False if systemctl failed."""
    import subprocess

    ctl = ["systemctl", "--user"] if user_unit else ["systemctl"]
    started = time.time()
    for args in (["daemon-reload"], ["enable", "--now", name], ["restart", name]):
        proc = subprocess.run(ctl + args, capture_output=True, text=True)
        done["commands"].append(shlex.join(ctl + args) + f" -> exit {proc.returncode} {proc.stderr.strip()}")
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
