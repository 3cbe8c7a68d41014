"""Operating a host from the workstation: park, unpark, retry, cancel, logs and bootstrap, as agent requests."""
from __future__ import annotations

import getpass
import socket
import time
from pathlib import Path
from typing import Any

import runner as runner_package


def who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (OSError, KeyError):
        return "plan"


def park_request(reason: str, now: bool) -> dict[str, Any]:
    return {"parked": {"since": time.strftime("%Y-%m-%d %H:%M:%S"), "reason": reason, "by": who()},
            "requeue_running": now}


def control_request(action: str, job: str) -> dict[str, Any]:
    name = job if job.endswith(".job") else f"{job}.job"
    return {"action": action, "job": name, "by": who()}


def runner_files() -> dict[str, str]:
    """The runner package, file by file: it is standard library only, so a copy is all a host needs."""
    base = Path(runner_package.__file__).resolve().parent
    return {f"runner/{p.name}": p.read_text() for p in sorted(base.glob("*.py"))}


def unit_for(root: str, python: str, user_unit: bool, user: str | None) -> str:
    from runner.unit import unit_text

    return unit_text(root, python, f"{root.rstrip('/')}/.plan-runner", None if user_unit else user,
                     wanted_by="default.target" if user_unit else "multi-user.target")
