"""`plan park`, `unpark`, `retry`, `cancel`, `logs`, `bootstrap` (one request to a host) and `plan hooks
install` (a git hook written)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from plancompiler.cli.shared import HostArg, HostsOpt, JobArg, app, fail, hooks_app, resolve_host, say


@app.command()
def park(
    host: HostArg,
    hosts: HostsOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="why: shown in status, events and by watch")] = "",
    now: Annotated[
        bool, typer.Option("--now", help="also end running jobs and put them back in queue/ (no attempt used)")
    ] = False,
    lane: Annotated[str | None, typer.Option("--lane", help="park this lane alone; the others run")] = None,
) -> None:
    """Stop HOST's runner from starting new jobs (running jobs finish unless --now), e.g. for reboot-per-side work.

    `plan watch` reports PARKED once, and again while the park lasts; lift it with `plan unpark`.
    """
    from plancompiler.commands import operate

    target = resolve_host(host, hosts)
    say(operate.park(target, reason, now, lane))


@app.command()
def unpark(
    host: HostArg,
    hosts: HostsOpt = None,
    lane: Annotated[str | None, typer.Option("--lane", help="let this parked lane go (not the whole queue)")] = None,
) -> None:
    """Let HOST's runner start jobs again (with --lane: that lane's)."""
    from plancompiler.commands import operate

    target = resolve_host(host, hosts)
    say(operate.unpark(target, lane))


@app.command()
def retry(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner to take the request")] = 30.0,
) -> None:
    """Move JOB from failed/ back to queue/ with its attempts reset; the runner does it and logs `retry`."""
    from plancompiler.commands import operate

    target = resolve_host(host, hosts)
    say(operate.retry(target, job, wait))


@app.command()
def cancel(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner to take the request")] = 30.0,
) -> None:
    """Remove a queued JOB, or end a running one's whole tree and file it in failed/ (`cancelled` event)."""
    from plancompiler.commands import operate

    target = resolve_host(host, hosts)
    say(operate.cancel(target, job, wait))


@app.command()
def logs(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing until the job ends or Ctrl-C")] = False,
    lines: Annotated[int, typer.Option("-n", "--lines", help="lines of the end of the log to show first")] = 40,
    interval: Annotated[float, typer.Option("--interval", help="seconds between reads with -f")] = 1.0,
) -> None:
    """Print JOB's log (running or ended), bounded to its last --lines; -f follows it until the job ends."""
    from plancompiler.commands import operate

    target = resolve_host(host, hosts)
    state = operate.logs(
        target,
        job,
        lines,
        follow,
        interval,
        lambda text: typer.echo(text, nl=False),
        lambda text: say(f"-- {text}", err=True),
    )
    if follow:
        say(f"-- {operate.job_file(job)} is {state or 'gone'}", err=True)


@app.command()
def bootstrap(
    host: HostArg,
    hosts: HostsOpt = None,
    user_unit: Annotated[bool, typer.Option("--user", help="a systemd --user unit instead of a system one")] = False,
    run_as: Annotated[str | None, typer.Option("--run-as", help="User= of a system unit (default: ssh user)")] = None,
    python: Annotated[str, typer.Option("--python", help="interpreter on the host")] = "/usr/bin/python3",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be done and change nothing")] = False,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner's first heartbeat")] = 30.0,
    start: Annotated[
        bool,
        typer.Option(
            "--start",
            help="where systemd is not running: start the runner detached (its own session and log, the unit's "
            "flags), unless one already serves the root",
        ),
    ] = False,
    tick: Annotated[str, typer.Option("--tick", help="the runner's tick (the unit's and --start's)")] = "10",
    no_cgroup: Annotated[
        bool, typer.Option("--no-cgroup", help="--start without --cgroup auto (where the cgroup is shared)")
    ] = False,
) -> None:
    """Install the standard-library runner under HOST's queue root and the root's own systemd unit
    (plan-runner-<root as systemd-escape --path writes it>.service), then wait for a heartbeat.

    Idempotent; a unit of that name that serves another root is not replaced. Where systemd is not running no unit
    is written: it prints the exact command to run instead, or with --start starts the runner detached (setsid,
    ROOT/.plan-runner/runner.log, the unit's flags) and says so when one already runs; `plan status` shows how the
    runner was started.
    """
    from plancompiler.commands import operate
    from runner.agent.unit import run_flags

    try:
        run_flags(tick)  # before the host is asked: a tick the runner refuses is a usage error
    except ValueError as exc:
        raise fail(f"--tick: {exc}") from exc
    target = resolve_host(host, hosts)
    plan = operate.bootstrap_plan(target, user_unit, run_as, python, tick)
    typer.echo("\n".join(plan.lines))
    if dry_run:
        typer.echo(plan.unit)
        typer.echo("dry run: nothing was changed", err=True)
        return
    for line in operate.bootstrap(target, plan, user_unit, python, wait, start, run_flags(tick, not no_cgroup)):
        say(line)


@hooks_app.command("install")
def hooks_install(
    repo: Annotated[Path, typer.Option("--repo", help="the git repository (default: the current directory)")] = Path(
        "."
    ),
    plans: Annotated[
        str, typer.Option("--plans", help="shell globs of the plan files the hook checks; the hosts file is skipped")
    ] = "plans/*.yaml plans/*.yml plans/*.py",
) -> None:
    """Write a git pre-push hook that runs `plan check` on the repository's plans and refuses the push on errors."""
    from plancompiler.commands.operate import install_hook

    hook = install_hook(repo, plans, sys.executable)
    typer.echo(f"wrote {hook}")
