"""`plan push` (a checked plan diffed against a host and installed) and `plan run` (a local queue run to the end)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from plancompiler.cli.shared import (
    GLOBAL,
    Format,
    HostArg,
    HostsOpt,
    PlanArg,
    SetOpt,
    TemplatesOpt,
    app,
    compile_one,
    fail,
    print_findings,
    resolve_host,
    say,
)

NoVerifyExternalOpt = Annotated[
    bool, typer.Option("--no-verify-external", help="do not check that the plan's external paths exist on the host")
]


@app.command()
def push(
    host: HostArg,
    plan: PlanArg,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    hosts: HostsOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the diff and change nothing")] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="re-queue this plan's failed jobs and reset their attempts")
    ] = False,
    no_prune: Annotated[
        bool, typer.Option("--no-prune", help="keep queued jobs of this plan that it no longer has")
    ] = False,
    no_verify_external: NoVerifyExternalOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the diff and result as JSON")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="warnings also refuse the push")] = False,
    take_over: Annotated[
        bool,
        typer.Option(
            "--take-over",
            help="replace jobs of the same name that another plan "
            "(or a hand-written file) owns; their attempts are reset",
        ),
    ] = False,
    lock_wait: Annotated[
        float, typer.Option("--lock-wait", help="seconds to wait for another push to the same host to finish")
    ] = 60.0,
    dead: Annotated[
        float, typer.Option("--dead", help="heartbeat age in seconds that counts as a dead runner (a warning)")
    ] = 300.0,
    stop_retired: Annotated[bool, typer.Option("--stop-retired", help="end retired running jobs")] = False,
    allow_shared_output: Annotated[
        list[str] | None, typer.Option("--allow-shared-output", metavar="PATH", help="another plan may write PATH too")
    ] = None,
) -> None:
    """Check PLAN, diff it against HOST's queue, print the diff, then install it atomically.

    Marks: + new, ~ changed, ^ stale, = unchanged, - retired (queued: removed unless --no-prune; running: left
    running unless --stop-retired), ! held (failed), r retried (--retry-failed), > running (left alone),
    >~ running but changed (reported), d done. What runs again is listed last with the size of what it redoes.
    A path that a job of another plan on the host also writes is refused unless --allow-shared-output PATH.
    A job of the same name that another plan owns is not replaced without --take-over. Pushes to one
    host take turns (--lock-wait); one whose queue changed after it looked is refused. A warning says
    when the runner there is stopped, dead, never started, or parked (--json: host_state).
    Nothing is sent unless the whole plan checks clean. Exit 0 ok, 1 refused, 3 host unreachable.
    """
    from plancompiler.push import PushOptions
    from plancompiler.push import push as push_plan

    target = resolve_host(host, hosts)
    compiled = _compiled(plan, set_, templates)
    code = print_findings([compiled], Format.text, strict)
    if code:
        typer.echo(f"plan: push refused: {plan} has errors; nothing was sent to {target.name}", err=True)
        raise typer.Exit(code)
    options = PushOptions(
        dry_run=dry_run,
        retry_failed=retry_failed,
        prune=not no_prune,
        verify_external=not no_verify_external,
        take_over=take_over,
        lock_wait_s=lock_wait,
        dead_s=dead,
        stop_retired=stop_retired,
        allow_shared_output=tuple(allow_shared_output or ()),
    )

    shown = []

    def show(diff) -> None:
        if as_json:
            shown.append(diff)  # printed once applied: an apply that fails adds its errors
        else:
            say(diff.text())

    try:
        outcome = push_plan(compiled, target, options, show)
    finally:
        for diff in shown:
            say(json.dumps(diff.to_json(), indent=1))
    for line in outcome.results:
        say(line)
    for note in outcome.notes:
        say(note, err=True)
    if outcome.diff.errors:
        raise typer.Exit(1)


def _compiled(plan: Path, sets: list[str] | None, templates: list[Path] | None):
    """PLAN compiled for a push. Where the check memo holds the findings of these very inputs (a `plan check` or
    a push of them ran before: plancompiler/memo/checkmemo.py), they are its findings and the lint is not run
    again (at 10 000 jobs it was half the compile); else the whole check runs and is remembered."""
    from plancompiler.memo import checkmemo

    memo_key = checkmemo.key(plan, sets or [], templates or [], GLOBAL["max_size"])
    remembered = checkmemo.load(memo_key) if memo_key else None
    compiled = compile_one(plan, sets, templates, lint=remembered is None)
    if remembered is not None:
        compiled.diagnostics = list(remembered.diagnostics)
    elif memo_key:
        checkmemo.store(memo_key, compiled.diagnostics, compiled.job_count)
    return compiled


@app.command("run")
def run_plan(
    plan: PlanArg,
    root: Annotated[Path | None, typer.Option("--root", help="local queue root (default .plan/<plan name>)")] = None,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    tick: Annotated[float, typer.Option("--tick", help="runner tick in seconds")] = 0.5,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="re-queue failed jobs first")] = False,
    no_verify_external: NoVerifyExternalOpt = False,
) -> None:
    """Check PLAN, push it to a local queue, and run the bundled runner until nothing more can run.

    Prints events as they happen and a summary table; exit 0 only when every job of the plan is done.
    """
    from plancompiler.commands.run import run_queue
    from plancompiler.hosts import Host
    from plancompiler.push import PushOptions
    from plancompiler.push import push as push_plan

    if not 0 < tick <= 3600:  # nan too: the runner would refuse it, and the run wait with nothing said
        raise fail(f"--tick must be above 0 and at most 3600 seconds, got {tick}")
    compiled = compile_one(plan, set_, templates)
    code = print_findings([compiled], Format.text, False)
    if code:
        typer.echo(f"plan: not run: {plan} has errors", err=True)
        raise typer.Exit(code)
    queue_root = Path(os.path.realpath(root or Path(".plan") / compiled.name))
    target = Host(name=str(queue_root), root=str(queue_root))

    def show(diff) -> None:
        typer.echo(diff.text())

    # no warning about the runner: this command starts one now
    options = PushOptions(retry_failed=retry_failed, expect_runner=False, verify_external=not no_verify_external)
    outcome = push_plan(compiled, target, options, show)
    if outcome.diff.errors:
        raise typer.Exit(1)
    summary = run_queue(queue_root, [j.filename for j in compiled.jobs], tick=tick, echo=typer.echo)
    typer.echo("")
    typer.echo(summary.table())
    raise typer.Exit(0 if summary.ok else 1)
