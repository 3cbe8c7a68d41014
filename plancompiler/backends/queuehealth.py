"""Whether a queue host's runner will run what is pushed: never started, stopped, dead, parked, or too old."""

from __future__ import annotations

import shlex
from typing import Any

from plancompiler.backends.protocol import PushOptions, PushPlan
from plancompiler.hosts import Host
from runner import FORMAT_VERSION
from runner.durations import format_duration
from runner.jobfile import format_needed


def health(result: PushPlan, host: Host, probe: dict[str, Any], options: PushOptions) -> None:
    """Warnings (and `host_state` for --json) about the runner that will run what is pushed."""
    status: dict[str, Any] = probe["status"] if isinstance(probe.get("status"), dict) else {}
    runner: dict[str, Any] = status["runner"] if isinstance(status.get("runner"), dict) else {}
    now = float(probe.get("now") or 0)
    beat = runner.get("heartbeat")
    age = now - beat if isinstance(beat, (int, float)) else None
    parked: dict[str, Any] | None = probe["parked"] if isinstance(probe.get("parked"), dict) else None
    version = runner.get("format_version")
    # queue/ after the push: a changed job's new file replaces its old one, a pruned one goes
    removed = {name for state, name in result.request.get("remove", []) if state == "queue"}
    queued = len(set(probe.get("files", {}).get("queue", {})) - removed | set(result.request.get("files", {})))
    state, why = _runner_state(host, probe, options, status, runner, age)
    result.host_state = {
        "runner": state,
        "heartbeat_age_s": age,
        "pid": runner.get("pid"),
        "format_version": version,
        "parked": parked,
    }
    if why and options.expect_runner:
        jobs = f"{queued} job{'s' * (queued != 1)}"
        done = "would be queued" if options.dry_run or result.errors else "queued"  # nothing is queued yet
        result.warnings.append(f"{jobs} {done} on {host.name}, but {why}")
    if parked:
        result.warnings.append(
            f"{host.name} is parked since {parked.get('since', '?')} by {parked.get('by', '?')}"
            f"{': ' + parked['reason'] if parked.get('reason') else ''}; no job starts until "
            f"`plan unpark {host.name}`"
        )
    # what the files need, read only of a runner older than this plancompiler (none needs more than it writes)
    older = isinstance(version, int) and version < FORMAT_VERSION
    needed = max((format_needed(text) for text in result.request.get("files", {}).values()), default=1) if older else 1
    if isinstance(version, int) and version < needed:
        result.errors.append(
            f"the runner on {host.name} reads job-file format {version}, this plan needs "
            f"{needed}: update it with `plan bootstrap {host.name}`"
        )
    elif isinstance(version, int) and version > FORMAT_VERSION:
        result.warnings.append(
            f"the runner on {host.name} reads job-file format {version}, newer than this "
            f"plan's {FORMAT_VERSION}: update plancompiler here"
        )


def _runner_state(
    host: Host,
    probe: dict[str, Any],
    options: PushOptions,
    status: dict[str, Any],
    runner: dict[str, Any],
    age: float | None,
) -> tuple[str, str]:
    """The host's runner: never-started, stopped, dead or running, and why it will not run the jobs ("" if it will)."""
    lifecycle: dict[str, Any] = probe.get("lifecycle") or {}
    if not status:
        return "never-started", (
            f"no runner has ever ticked there (no status.json under {host.root}): "
            f"start one with `plan bootstrap {shlex.quote(host.name)} --start` (detached, no systemd needed), "
            f"`plan bootstrap {shlex.quote(host.name)}` (a systemd unit) or "
            f"`python3 -m runner run --root {shlex.quote(host.root)}`"
        )
    if lifecycle.get("event") == "runner-stop":
        return "stopped", f"its runner stopped at {lifecycle.get('ts', '?')} (runner-stop) and has not started since"
    if age is not None and age > options.dead_s:
        return "dead", f"no runner has ticked there for {format_duration(age)}"
    if not probe.get("runner_alive", True):
        return "dead", f"its runner (pid {runner.get('pid')}) is not running"
    return "running", ""
