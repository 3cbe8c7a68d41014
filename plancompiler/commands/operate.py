"""Operating a host from the workstation: park, unpark, retry, cancel, logs and bootstrap, through its backend."""

from __future__ import annotations

import getpass
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancompiler import transport
from plancompiler.backends import backend_for
from plancompiler.backends.protocol import who
from plancompiler.errors import OperateError as OperateError  # its home is plancompiler/errors.py
from plancompiler.errors import answered
from plancompiler.hosts import Host
from runner import jobfile
from runner.readers import terminal_safe


def ask(host: Host, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    return answered(backend_for(host).operate(mode, request, timeout), host.describe(), OperateError)


def job_file(job: str) -> str:
    """JOB's file name; a name no job can have (a newline, a second '/', a leading '.') is a usage error (exit 2),
    not a request the runner would refuse after the whole wait."""
    name = job if job.endswith(".job") else f"{job}.job"
    parts = name[:-4].split("/")  # a Slurm host's jobs are PLAN/JOB
    if len(parts) > 2 or not all(jobfile.NAME_RE.fullmatch(p) for p in parts) or ".." in name:
        raise OperateError(
            f"bad job name {job!r}: use letters, digits, '.', '_' and '-', not starting with '.' or '-'", 2
        )
    return name


def park(host: Host, reason: str, now: bool, lane: str | None = None) -> str:
    """Park HOST's queue, or with LANE that lane alone (its jobs wait `parked`, the other lanes run)."""
    if lane is not None and now:
        raise OperateError("--now ends every running job: it parks the whole queue, not one --lane", 2)
    parked = {"since": time.strftime("%Y-%m-%d %H:%M:%S"), "reason": reason, "by": who()}
    ask(host, "park", {"parked": parked, "requeue_running": now, **({"lane": lane} if lane else {})})
    what = f"lane {lane} of {host.describe()}" if lane else host.describe()
    return f"parked {what}" + (f": {reason}" if reason else "")


def unpark(host: Host, lane: str | None = None) -> str:
    result = ask(host, "park", {"parked": None, **({"lane": lane} if lane else {})})
    what = f"lane {lane} of {host.describe()}" if lane else host.describe()
    return f"unparked {what}" if result.get("unparked") else f"{what} was not parked"


def _control(host: Host, action: str, job: str, wait: float, **body: str) -> dict[str, Any]:
    request = {"action": action, "job": job_file(job), "by": who(), "wait_s": wait, **body}
    result = ask(host, "control", request, wait + 30)
    if result.get("no_runner"):
        raise OperateError(
            f"no runner serves {host.name} now: the request ({action} {request['job']}) is queued there and is "
            "carried out when a runner starts"
        )
    if not result.get("taken"):
        raise OperateError(
            f"the request is queued on {host.name}, but no runner took it within {wait:g}s: is the runner running?"
        )
    return result


def retry(host: Host, job: str, wait: float) -> str:
    """Move JOB from failed/ back to queue/ with its attempts reset (the runner does it)."""
    result = _control(host, "retry", job, wait)
    if result.get("before") != "failed":
        raise OperateError(f"{job} was not in failed/ (it is {result.get('before') or 'nowhere'}): nothing retried")
    return f"{job}: failed -> {result.get('after')}"


def cancel(host: Host, job: str, wait: float) -> str:
    result = _control(host, "cancel", job, wait)
    before = result.get("before")
    if before not in ("queue", "running"):
        raise OperateError(f"{job} is neither queued nor running (it is {before or 'nowhere'}): nothing cancelled")
    return f"{job}: {before} -> {result.get('after') or 'removed'}"


def ack_on_box(host: Host, target: str, until: float | None, wait: float, for_: str | None) -> list[str] | None:
    """`plan ack` of what the box's runner judged (runner.alerts.book): the lines saying what it silenced; None when
    the book has no such kind (the watcher's own then); OperateError when it names nothing open there."""
    from plancompiler.watch import INCIDENT_KINDS
    from runner.alerts.book import known_kind

    if host.backend != "queue" or not known_kind(target):
        return None
    answer = ask(host, "ack", {"target": target, "until": until, "by": who(), "wait_s": wait})
    if not answer.get("matched"):
        open_ = ", ".join(answer.get("open") or []) or "none"
        if target.partition(":")[0].strip().upper() in INCIDENT_KINDS:
            return None  # a kind the watcher judges too (STALL, WAITING, ...): it may have it
        raise OperateError(f"no open incident {target} on {host.name} (open: {open_})")
    from runner.alerts.book import JOINING_IS_NEWS

    def lasts(kind: str) -> str:
        joined = " or a job joins it" if kind in JOINING_IS_NEWS else ""
        return f"for {for_}{joined}" if for_ else f"until it recovers{joined}"

    lines = [
        terminal_safe(f"acked {item['id']} on {host.name} {lasts(str(item.get('kind')))}: {item['text']}")
        for item in answer["matched"]
    ]
    if answer.get("no_runner"):
        lines.append(f"no runner serves {host.name} now: it takes the ack when it starts")
    elif not answer.get("taken"):
        lines.append("the runner has not taken the ack yet (is it running?); it will when it ticks")
    return lines


def hold(host: Host, jobs: list[str], wait: float, release: bool = False) -> list[str]:
    """Hold queued JOBS (or RELEASE them): the runner keeps a held job from starting, across its restarts."""
    lines = []
    for job in jobs:
        result = _control(host, "release" if release else "hold", job, wait)
        if result.get("before") != "queue":
            where = result.get("before") or "nowhere"
            raise OperateError(f"{job_file(job)} is not queued (it is {where}): only a queued job is held or released")
        if not release and result.get("after") != "queue":  # the runner started it before it read the request
            raise OperateError(f"{job_file(job)} started before the hold was taken (it is {result.get('after')})")
        lines.append(f"{job_file(job)}: {'released' if release else 'held'}")
    return lines


def move(host: Host, job: str, to: str, other: str | None, wait: float) -> str:
    """Give queued JOB the priority that starts it first, last, or before OTHER in its lane (its name unchanged)."""
    body = {"to": to, **({"other": job_file(other)} if other else {})}
    result = _control(host, "move", job, wait, **body)
    if other and result.get("other") != "queue":
        where = result.get("other") or "nowhere"
        raise OperateError(f"{job_file(other)} is not queued (it is {where}): nothing to move {job_file(job)} before")
    if result.get("before") != "queue":
        where = result.get("before") or "nowhere"
        raise OperateError(f"{job_file(job)} is not queued (it is {where}): only a queued job is moved")
    return f"{job_file(job)}: moved {'before ' + job_file(other) if other else to}"


def logs(
    host: Host,
    job: str,
    lines: int,
    follow: bool,
    interval: float,
    echo: Callable[[str], None],
    note: Callable[[str], None] = lambda text: None,
) -> str | None:
    """Print JOB's log tail with ECHO, and with FOLLOW what it adds until the job ends; the job's last state. A
    queued job that has no log yet is said with NOTE (it printed nothing, and -f waited without a word)."""
    name = job_file(job)
    answer = ask(host, "logs", {"job": name, "lines": lines})
    if not answer.get("exists") and not answer.get("state"):
        raise OperateError(f"no job {name} and no log for it on {host.name}")
    if not answer.get("exists") and answer.get("state") == "queue":
        note(f"{name} is queued and has not started: no log yet" + ("; following it" if follow else ""))
    echo(terminal_safe(str(answer.get("text", ""))))
    offset = answer.get("offset", 0)
    try:
        while follow and answer.get("state") in ("running", "queue"):
            time.sleep(interval)
            answer = ask(host, "logs", {"job": name, "offset": offset})
            echo(terminal_safe(str(answer.get("text", ""))))
            offset = answer.get("offset", offset)
    except KeyboardInterrupt:
        pass
    state = answer.get("state")
    return state if isinstance(state, str) else None


def unit_for(root: str, python: str, user_unit: bool, user: str | None, tick: str = "10") -> str:
    from runner.agent.unit import unit_text

    return unit_text(
        root,
        python,
        f"{root.rstrip('/')}/.plan-runner",
        None if user_unit else user,
        tick,
        wanted_by="default.target" if user_unit else "multi-user.target",
    )


@dataclass(frozen=True)
class BootstrapPlan:
    files: dict[str, str]
    unit: str
    lines: list[str]


def bootstrap_plan(host: Host, user_unit: bool, run_as: str | None, python: str, tick: str = "10") -> BootstrapPlan:
    files = transport.runner_sources()
    user = run_as or (
        None if user_unit else (host.ssh.split("@")[0] if host.ssh and "@" in host.ssh else getpass.getuser())
    )
    try:
        unit = unit_for(host.root, python, user_unit, user, tick)
    except ValueError as exc:
        raise OperateError(f"{host.describe()}: {exc}") from None
    return BootstrapPlan(
        files,
        unit,
        [
            f"bootstrap {host.describe()}:",
            f"  copy the runner ({len(files)} files) to {host.root}/.plan-runner/runner/",
            f"  where systemd runs, write the {'user' if user_unit else 'system'} unit "
            f"{_unit_said(host.root)} (this root's own) and start it; elsewhere, no unit",
        ],
    )


def _unit_said(root: str) -> str:
    """The unit a root's bootstrap writes, as the dry run can name it: a root under `~` is named by the host from
    the path it expands to, which only the host knows."""
    from runner.agent.unit import UNIT_PREFIX, unit_name

    if root.startswith("~"):
        return f"{UNIT_PREFIX}-<{root} as the host expands it>.service"
    return shlex.quote(unit_name(root))


# Why the host wrote no unit (runner.agent.bootstrap's answer), as said: an older agent says nothing, and it knew
# only the first.
_NO_SYSTEMD = {
    "system": "systemd is not running on {host}: no unit written",
    "user": "no systemd user manager for this login on {host}: no unit written (a --user unit needs a login "
    "session that has one, or `loginctl enable-linger`)",
}


def bootstrap(
    host: Host,
    plan: BootstrapPlan,
    user_unit: bool,
    python: str,
    wait: float,
    start: bool = False,
    flags: list[str] | None = None,
) -> list[str]:
    """Install the runner and its unit; the lines to print. OperateError when the unit started but never ticked.
    START: where no systemd runs, start the runner detached with FLAGS (the unit's), unless one already runs."""
    from runner.agent.unit import run_flags

    result = ask(
        host,
        "bootstrap",
        {
            "files": plan.files,
            "content_hash": transport.runner_zip()[0],
            "unit": plan.unit,
            "user_unit": user_unit,
            "python": python,
            "wait_s": wait,
            "create": True,
            "start": start,
            "flags": flags if flags is not None else run_flags(),
            "by": who(),
        },
        wait + 60,
    )
    lines = [f"  wrote {len(result.get('written', []))} files, {len(result.get('unchanged', []))} unchanged"]
    if not result.get("systemd"):
        said = _NO_SYSTEMD.get(str(result.get("no_systemd")), _NO_SYSTEMD["system"])
        lines.append("  " + said.format(host=host.name))
    if isinstance(result.get("start"), dict):
        return lines + _started(host, result["start"], wait)
    lines += [f"  {command}" for command in result.get("commands", [])]
    unit = shlex.quote(str(result.get("unit_name")))
    if result.get("unit_error"):
        raise OperateError("\n".join(lines) + f"\nplan: unit {result.get('unit_path')}: {result['unit_error']}")
    if result.get("systemd") and not result.get("heartbeat"):
        raise OperateError(
            "\n".join(lines) + f"\nplan: the unit {unit} was started but no heartbeat came within "
            f"{wait:g}s: journalctl {'--user ' if user_unit else ''}-u {unit}"
        )
    if result.get("systemd"):
        lines.append(f"  wrote and started the unit {result.get('unit_path')}")
    if result.get("heartbeat"):
        lines.append("  runner is ticking")
    return lines


def install_hook(repo: Path, globs: str, python: str) -> Path:
    """REPO's git pre-push hook written (or rewritten, where plan wrote it) to check GLOBS with PYTHON's plan;
    OperateError where REPO is no git repository (exit 2) or its hook is someone else's (exit 1)."""
    git_dir = repo / ".git"
    if not git_dir.is_dir():
        raise OperateError(f"{repo} is not a git repository (no .git directory)", 2)
    hook = git_dir / "hooks" / "pre-push"
    hook.parent.mkdir(exist_ok=True)
    if hook.exists() and "plan hooks install" not in hook.read_text(errors="replace"):
        raise OperateError(f"{hook} exists and was not written by plan: add `plan check` to it by hand", 1)
    hook.write_text(pre_push_hook(python, globs))
    hook.chmod(0o755)
    return hook


def _started(host: Host, started: dict[str, Any], wait: float) -> list[str]:
    """What `--start` did: started (with its pid and log), or found one running; OperateError if it died."""
    if started.get("already") is not None:
        return [f"  a runner already serves {host.root} (pid {started['already']}, started {started.get('how')})"]
    pid, log = started.get("started"), started.get("log")
    if started.get("exited") is not None:
        tail = str(started.get("log_tail") or "").strip().splitlines()[-5:]
        raise OperateError(
            f"the runner started on {host.name} exited {started['exited']} at once; {log}:\n" + "\n".join(tail)
        )
    command = " ".join(str(w) for w in started.get("command") or [])
    lines = [f"  started the runner detached: pid {pid}, log {log}", f"  {command}"]
    if not started.get("heartbeat"):
        raise OperateError("\n".join(lines) + f"\nplan: no heartbeat came within {wait:g}s: see {log}")
    lines.append("  runner is ticking")
    return lines


def pre_push_hook(python: str, globs: str) -> str:
    """A POSIX sh pre-push hook: `plan check` over the plan files that exist (not the hosts file)."""
    return f"""#!/bin/sh
# generated by `plan hooks install`: refuse a push whose plans do not check clean
cd "$(git rev-parse --show-toplevel)" || exit 1
set --
for f in {globs}; do
  case "$f" in */hosts.yaml|*/hosts.yml) continue ;; esac
  [ -f "$f" ] && set -- "$@" "$f"
done
[ "$#" -eq 0 ] && exit 0
exec {python} -m plancompiler.cli check "$@"
"""
