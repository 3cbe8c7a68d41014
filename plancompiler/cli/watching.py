"""`plan status`, `plan watch` and `plan ack`: a host's queue probed, judged, and its incidents silenced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from plancompiler.cli.shared import HostArg, HostsOpt, app, fail, output_file, resolve_host

HISTORY_N = 20  # `plan status HOST --history` alone
HISTORY_BYTES = 4 << 20


@app.command()
def status(
    host: HostArg,
    hosts: HostsOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the host's status.json, counts, recent events and estimates as JSON")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds the probe may take (default: the host's timeout:)")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="every waiting job on a line (default: grouped)")] = False,
    history: Annotated[bool, typer.Option("--history", help="instead: the last ends, one line each")] = False,
    last: Annotated[int, typer.Option("-n", "--last", help="--history: how many ends")] = HISTORY_N,
    plan: Annotated[str | None, typer.Option("--plan", help="--history: only this plan's jobs")] = None,
    lane: Annotated[str | None, typer.Option("--lane", help="--history: only this lane's jobs")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="--history: only ends with this outcome")] = None,
) -> None:
    """What each lane runs, why queued jobs wait (grouped by reason and blocker, the oldest first), recent ends,
    the runner's heartbeat and how it was started; when running jobs should end and queued ones start (estimates,
    with their basis: progress, or earlier runs' lengths).

    One bounded round trip. Exit 0, 1 if the queue cannot be read, 3 if the host is unreachable.
    """
    from plancompiler.backends import backend_for
    from plancompiler.errors import answered
    from plancompiler.watch import check_outcome, history_ends, history_json, history_text

    if not history and (plan or lane or outcome):
        raise fail("--plan, --lane and --outcome filter --history")
    check_outcome(outcome)  # a HistoryError (exit 2) before the host is asked
    target = resolve_host(host, hosts)
    # The history reads a larger tail of events.jsonl: up to HISTORY_BYTES, the ends of the last few thousand jobs.
    request = {"offset": -1, "tail_bytes": HISTORY_BYTES} if history else {"offset": -1, "estimates": True}
    if not history and not every and not as_json:
        request["grouped"] = True  # the agent groups the waiting jobs: 10 000 of them are not sent one by one
    answer = answered(backend_for(target).status(request, timeout), target.describe())
    if history:
        ends = history_ends(answer.get("events") or [], last, plan, lane, outcome)
        typer.echo(json.dumps(history_json(ends), indent=1) if as_json else history_text(ends, target.describe()))
        return
    from plancompiler.watch import status_text

    if as_json:
        keys = ("status", "counts", "events", "runner_alive", "now", "parked", "parked_lanes", "estimates")
        typer.echo(json.dumps({k: answer.get(k) for k in keys}, indent=1))
    else:
        typer.echo(status_text(target, answer, every))
    if answer.get("status_error"):
        raise typer.Exit(1)  # the queue's status.json is there but unreadable: said above


def _watch_words() -> tuple[str, str, str, str]:
    from plancompiler.watch import ALERTABLE_EVENTS, DEFAULT_EVENTS, INCIDENT_KINDS, WAITING_REASONS

    return (
        ", ".join(ALERTABLE_EVENTS),
        ", ".join(WAITING_REASONS),
        ", ".join(INCIDENT_KINDS),
        ", ".join(DEFAULT_EVENTS),
    )


_EVENT_WORDS, _REASON_WORDS, _KIND_WORDS, _DEFAULT_EVENT_WORDS = _watch_words()
SECONDS = "SECONDS"


@app.command()
def watch(
    host: HostArg,
    hosts: HostsOpt = None,
    interval: Annotated[float, typer.Option("--interval", metavar=SECONDS, help="seconds between probes")] = 120.0,
    once: Annotated[bool, typer.Option("--once", help="probe once and exit (for cron)")] = False,
    probe_timeout: Annotated[
        float, typer.Option("--probe-timeout", metavar=SECONDS, help="seconds one probe may take in all")
    ] = 60.0,
    wake_on: Annotated[
        list[str] | None,
        typer.Option(
            "--wake-on",
            metavar="EVENT",
            help=f"also alert on these events (repeatable or comma-separated), e.g. "
            f"--wake-on done. Events: {_EVENT_WORDS}",
        ),
    ] = None,
    events: Annotated[
        str | None,
        typer.Option(
            "--events",
            metavar="EVENT,...",
            help=f"the events that alert, comma-separated, or 'none' (default: {_DEFAULT_EVENT_WORDS})",
        ),
    ] = None,
    waiting: Annotated[
        list[str] | None,
        typer.Option(
            "--waiting",
            metavar="[REASON=]DURATION",
            help="WAITING when a queued job has waited this long on one "
            "reason (default 30m); REASON=DURATION sets one reason's limit (repeatable). "
            f"Reasons: {_REASON_WORDS}",
        ),
    ] = None,
    stall: Annotated[
        float, typer.Option("--stall", metavar=SECONDS, help="seconds a net job may run before STALL")
    ] = 3600.0,
    idle: Annotated[
        float, typer.Option("--idle", metavar=SECONDS, help="seconds of nothing running before IDLE")
    ] = 600.0,
    dead: Annotated[
        float, typer.Option("--dead", metavar=SECONDS, help="heartbeat age in seconds that means DEAD")
    ] = 300.0,
    unreachable: Annotated[
        int, typer.Option("--unreachable", metavar="N", help="failed probes in a row before UNREACHABLE")
    ] = 5,
    parked_repeat: Annotated[
        float, typer.Option("--parked-repeat", metavar=SECONDS, help="seconds before a lasting park is reported again")
    ] = 7200.0,
    on_alert: Annotated[
        str | None,
        typer.Option(
            "--on-alert",
            metavar="CMD",
            help="run CMD for each alert (alert JSON on stdin, kind in $PLAN_ALERT_KIND) and keep watching",
        ),
    ] = None,
    realert: Annotated[
        float, typer.Option("--realert", metavar=SECONDS, help="seconds before an open incident is sent again")
    ] = 3600.0,
    hook_timeout: Annotated[
        float, typer.Option("--hook-timeout", metavar=SECONDS, help="seconds --on-alert/--ping may run")
    ] = 30.0,
    ping: Annotated[
        str | None,
        typer.Option(
            "--ping",
            metavar="CMD|URL",
            help="after every successful probe, POST its state to URL or run CMD (a dead-man's switch for the watcher)",
        ),
    ] = None,
    notify: Annotated[
        list[str] | None,
        typer.Option("--notify", metavar="URL", help="send each alert here (repeatable): see docs/watching.md"),
    ] = None,
    heartbeat_every: Annotated[
        str | None,
        typer.Option(
            "--heartbeat-every",
            metavar="DURATION",
            help="also print (or send to --on-alert as OK) one all-clear line "
            "this often, e.g. 6h: the lanes and the open incidents",
        ),
    ] = None,
    incidents: Annotated[
        bool, typer.Option("--incidents", help="list the open incidents from the state file and exit (no probe)")
    ] = False,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            metavar="FILE",
            help="state file (event offset, incidents); default under ~/.local/state/plancompiler",
        ),
    ] = None,
) -> None:
    """Probe HOST every --interval seconds and print `KIND: detail` lines (docs/watching.md).

    A box whose runner keeps the incident book: its incidents (one per cause; EVENT 10, STALL 11, IDLE 12,
    BLOCKED 13, PARKED 17, WAITING 18), and what only the watcher sees: DEAD 14, STOPPED 21 (a runner that
    stopped cleanly, while jobs are queued), UNREACHABLE 15, ERROR 16, SKEW 20; after a gap, one DIGEST 19.
    Otherwise (Slurm, an older runner) judged here by the flags. An incident is sent when it opens and every
    --realert, RECOVERED (exit 0) when it clears. Without --on-alert the watcher exits on the first alert; --once
    exits 0 when there is nothing new.
    """
    from plancompiler.watch import (
        Rules,
        WatchOptions,
        duration,
        event_names,
        incident_lines,
        state_path,
        waiting_limits,
        watch_loop,
    )

    target = resolve_host(host, hosts)
    if state is not None and not incidents:
        output_file(state, "--state")
    path = state or state_path(target)
    if incidents:
        for line in incident_lines(path):
            typer.echo(line)
        return
    try:
        kinds = event_names(events, wake_on)
        waiting_s, waiting_by_reason = waiting_limits(waiting, 1800.0)
        every = duration("--heartbeat-every", heartbeat_every) if heartbeat_every else None
    except ValueError as exc:
        raise fail(str(exc)) from exc
    rules = Rules(
        events=kinds,
        net_stall_s=stall,
        idle_s=idle,
        dead_s=dead,
        unreachable_n=unreachable,
        parked_repeat_s=parked_repeat,
        waiting_s=waiting_s,
        waiting_by_reason=waiting_by_reason,
    )
    options = WatchOptions(
        interval=interval,
        once=once,
        probe_timeout=probe_timeout,
        on_alert=on_alert,
        realert=realert,
        hook_timeout=hook_timeout,
        ping=ping,
        heartbeat_every=every,
        notify=tuple(notify or ()),
    )
    # a bad --probe-timeout or --notify is a usage error (a PlanError, exit 2) before any probe
    code = watch_loop(target, rules, path, options, echo=typer.echo, warn=lambda m: typer.echo(m, err=True))
    raise typer.Exit(code)


@app.command()
def ack(
    host: HostArg,
    incident: Annotated[
        str,
        typer.Argument(
            metavar="KIND[:SUBJECT]",
            help=f"the open incident: its kind ({_KIND_WORDS}) and, where several are open, its job, lane or host",
        ),
    ],
    for_: Annotated[
        str | None,
        typer.Option(
            "--for",
            metavar="DURATION",
            help="silence it at most this long, e.g. 8h (default: until it changes or recovers)",
        ),
    ] = None,
    hosts: HostsOpt = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state", metavar="FILE", help="the watcher's state file (default under ~/.local/state/plancompiler)"
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option("--wait", help="seconds to wait for the box's runner to take the ack"),
    ] = 30.0,
) -> None:
    """Silence open incidents until they recover (or change), or --for passes: on the box first (the runner's
    incident book: every channel it notifies goes quiet; KIND may be a cause such as failed or gpu-held, and
    SUBJECT a pattern such as 92c-*), else one `plan watch` judged here (DEAD, STOPPED, UNREACHABLE, ERROR).

    Exit 0 when acked, 1 when no open incident (or more than one) matches, 2 for an unknown kind.
    """
    import time

    from plancompiler.commands import operate
    from plancompiler.watch import acknowledge, duration, state_path

    target = resolve_host(host, hosts)
    if state is not None:
        output_file(state, "--state")
    try:
        seconds = duration("--for", for_) if for_ else None
    except ValueError as exc:
        raise fail(str(exc)) from exc
    now = time.time()
    said = operate.ack_on_box(target, incident, now + seconds if seconds else None, wait, for_)
    if said is not None:
        typer.echo("\n".join(said))
        return
    found = acknowledge(state or state_path(target), incident, now + seconds if seconds else None, now)
    typer.echo(
        f"acked {found.kind}:{found.subject} on {target.name} "
        + (f"for {for_}" if for_ else "until it changes or recovers")
        + f": {found.detail}"
    )
