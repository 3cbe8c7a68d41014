"""`plan add`, `hold`, `release`, `move`: one job at a time, as pueue and task-spooler users work (one request to a
host each; `plan add` compiles its job first)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from plancompiler.cli.shared import GLOBAL, Format, HostArg, HostsOpt, JobArg, app, fail, print_findings
from plancompiler.cli.shared import resolve_host as _resolve

WaitOpt = Annotated[float, typer.Option("--wait", help="seconds to wait for the runner to take the request")]
JobsArg = Annotated[list[str], typer.Argument(help="the jobs' names (with or without .job)", metavar="JOB")]


@app.command()
def add(
    host: HostArg,
    command: Annotated[
        list[str] | None, typer.Argument(help="the command and its arguments, after --", metavar="-- CMD ARG")
    ] = None,
    hosts: HostsOpt = None,
    lane: Annotated[str, typer.Option("--lane", help="the lane it runs in")] = "cpu",
    requires: Annotated[
        list[str] | None, typer.Option("--requires", metavar="PATH", help="a file it waits for (made outside)")
    ] = None,
    after: Annotated[
        list[str] | None, typer.Option("--after", metavar="JOB", help="a job it waits to end done")
    ] = None,
    outputs: Annotated[
        list[str] | None, typer.Option("--outputs", metavar="PATH", help="a file it promises (its DONE_IF)")
    ] = None,
    timeout: Annotated[str | None, typer.Option("--timeout", help="wall-clock limit: 90, 90s, 10m, 6h")] = None,
    retries: Annotated[
        int,
        typer.Option("--retries", help="attempts in all, the first one included (1: no retry), as a plan's `retries`"),
    ] = 1,
    priority: Annotated[int, typer.Option("--priority", help="higher starts first within the lane")] = 0,
    name: Annotated[str | None, typer.Option("--name", help="the job's name (default add-TIME-PROGRAM)")] = None,
    shell: Annotated[
        str | None, typer.Option("--shell", metavar="STRING", help="a line of shell code instead of a command")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help='print {"job", "host", "lane"}')] = False,
) -> None:
    """Queue one job on HOST: CMD and its ARGs, each quoted as one word (never read as shell), or --shell STRING.

    Checked as a plan job is (bash -n, shellcheck, the escaping rules: exit 1 on a finding), installed under
    the push lock in the `adhoc` plan, which no plan's push replaces or prunes. Prints the job's name.
    """
    from plancompiler.commands.add import AddSpec, add

    if shell is not None and command:
        raise fail("give the command after -- or as --shell STRING, not both")
    if shell is None and not command:
        raise fail("no command: give it after -- (plan add HOST -- CMD ARG...) or as --shell STRING")
    spec = AddSpec(
        lane=lane,
        argv=tuple(command or ()),
        shell=shell,
        requires=tuple(requires or ()),
        after=tuple(after or ()),
        outputs=tuple(outputs or ()),
        timeout=timeout,
        retries=retries,
        priority=priority,
        name=name,
    )
    target = _resolve(host, hosts)
    added = add(target, spec, GLOBAL.get("limits"))
    if not isinstance(added, str):
        raise typer.Exit(print_findings([added], Format.text, False) or 1)
    if as_json:
        typer.echo(json.dumps({"job": added, "host": target.describe(), "lane": lane}))
    else:
        typer.echo(added[: -len(".job")] if added.endswith(".job") else added)


@app.command()
def hold(host: HostArg, jobs: JobsArg, hosts: HostsOpt = None, wait: WaitOpt = 30.0) -> None:
    """Keep queued JOBs from starting (reason `held`, never alerted) until `plan release`; kept across restarts."""
    from plancompiler.commands import operate

    target = _resolve(host, hosts)
    typer.echo("\n".join(operate.hold(target, jobs, wait)))


@app.command()
def release(host: HostArg, jobs: JobsArg, hosts: HostsOpt = None, wait: WaitOpt = 30.0) -> None:
    """Let held JOBs start again, in their place in their lane."""
    from plancompiler.commands import operate

    target = _resolve(host, hosts)
    typer.echo("\n".join(operate.hold(target, jobs, wait, release=True)))


@app.command()
def move(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    first: Annotated[bool, typer.Option("--first", help="before every other queued job of its lane")] = False,
    last: Annotated[bool, typer.Option("--last", help="after every other queued job of its lane")] = False,
    before: Annotated[str | None, typer.Option("--before", metavar="OTHER", help="just before OTHER")] = None,
    wait: WaitOpt = 30.0,
) -> None:
    """Change where queued JOB starts in its lane by its priority, never its name (a rename is a new job)."""
    from plancompiler.commands import operate

    picked = [to for to, given in (("first", first), ("last", last), ("before", before is not None)) if given]
    if len(picked) != 1:
        raise fail("give one of --first, --last or --before OTHER")
    target = _resolve(host, hosts)
    typer.echo(operate.move(target, job, picked[0], before, wait))
