"""The `plan` command: parses arguments, calls one stage function, prints, returns an exit code."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from plancompiler import __version__
from plancompiler.diagnostics import PlanError, format_all, has_errors, summary

app = typer.Typer(
    name="plan",
    help="Compile typed job plans into checked bash job files, push them to a host's queue, "
    "and watch and report on the runner. Exit codes: 0 ok, 1 findings or refused, 2 usage or I/O, "
    "3 host unreachable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: paragraphs re-wrapped, [brackets] shown as written
)
hooks_app = typer.Typer(help="Git hooks that run `plan check` before a push.", no_args_is_help=True)
app.add_typer(hooks_app, name="hooks")


class Format(str, Enum):
    text = "text"
    json = "json"
    github = "github"


class GraphFormat(str, Enum):
    dot = "dot"
    mermaid = "mermaid"


SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="override a plan var (repeatable), e.g. --set work=/tmp/demo"),
]
TemplatesOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--templates",
        metavar="DIR",
        help="look for templates here first (repeatable); then in templates/ "
        "beside the plan, templates/ in the plan's parent directory, and ./templates",
    ),
]
PlansArg = Annotated[
    list[Path], typer.Argument(help="plan files: YAML (.yaml/.yml) or Python (.py)", metavar="PLAN...")
]
PlanArg = Annotated[Path, typer.Argument(help="a plan file: YAML or Python", metavar="PLAN")]


def _overrides(values: list[str] | None) -> dict[str, str]:
    result = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes KEY=VALUE, not {item!r}")
        result[key.strip()] = value
    return result


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"plan: {message}", err=True)
    return typer.Exit(code)


def _compile(
    path: Path, sets: list[str] | None, templates: list[Path] | None, no_cache: bool = False, lint: bool = True
):
    from plancompiler.compile import compile_plan

    try:
        progress = (lambda m: typer.echo(f"{path}: {m}", err=True)) if sys.stderr.isatty() else None
        return compile_plan(
            path,
            _overrides(sets),
            templates or [],
            lint=lint,
            use_cache=not no_cache,
            progress=progress,
            limits=_GLOBAL["limits"],
        )
    except PlanError as exc:
        raise _fail(str(exc)) from exc
    except (typer.Exit, typer.BadParameter):
        raise
    except Exception as exc:  # a bug of ours: one line, exit 2, the traceback under --debug
        raise _internal(str(path), exc) from exc


def _internal(what: str | None, exc: BaseException) -> typer.Exit:
    if _GLOBAL["debug"]:
        import traceback

        traceback.print_exception(exc)
    return _fail(
        f"{what + ': ' if what else ''}internal error, please report ({type(exc).__name__}: {str(exc)[:200]})"
        + ("" if _GLOBAL["debug"] else "; run with --debug for the traceback")
    )


def _report(compiled_list, fmt: Format, strict: bool) -> int:
    diagnostics = [d for c in compiled_list for d in c.diagnostics]
    text = format_all(diagnostics, fmt.value)
    if text:
        typer.echo(text)
    jobs = sum(c.job_count for c in compiled_list)
    if fmt is Format.text:
        typer.echo(summary(diagnostics, jobs), err=True)
    if any(d.code == "P000" for d in diagnostics):
        return 2
    return 1 if has_errors(diagnostics, strict) else 0


@app.command()
def check(
    plans: PlansArg,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format", help="text (path:line:col: severity[code]: message), json, or github (workflow annotations)"
        ),
    ] = Format.text,
    strict: Annotated[bool, typer.Option("--strict", help="warnings fail the check too")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="re-run shellcheck on every job")] = False,
) -> None:
    """Load, expand, graph-check, render and lint each PLAN; print every finding of every job.

    Exit 0 when clean, 1 when there are errors (or warnings with --strict), 2 on usage or I/O errors.
    """
    compiled = [_checked(p, set_, templates, no_cache) for p in plans]
    raise typer.Exit(_report(compiled, fmt, strict))


def _checked(path: Path, sets: list[str] | None, templates: list[Path] | None, no_cache: bool):
    """PATH's check: remembered where every input is as the last full check found it, else compiled."""
    from plancompiler import checkmemo

    memo_key = None if no_cache else checkmemo.key(path, sets or [], templates or [], _GLOBAL["max_size"])
    remembered = checkmemo.load(memo_key) if memo_key else None
    if remembered is not None:
        return remembered
    compiled = _compile(path, sets, templates, no_cache)
    if memo_key:
        checkmemo.store(memo_key, compiled.diagnostics, compiled.job_count)
    return compiled


@app.command()
def render(
    plan: PlanArg,
    out: Annotated[Path, typer.Option("-o", "--out", help="directory to write the job files to")],
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="warnings also stop the write")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="re-run shellcheck on every job")] = False,
) -> None:
    """Check PLAN, then write its job files to DIR; on any error DIR is left untouched.

    DIR is replaced as a whole: afterwards it holds exactly this plan's jobs.
    """
    from plancompiler.commands.write import write_jobs

    compiled = _compile(plan, set_, templates, no_cache)
    code = _report([compiled], Format.text, strict)
    if code:
        typer.echo(f"plan: nothing written to {out}", err=True)
        raise typer.Exit(code)
    try:
        write_jobs(compiled.jobs, out)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from exc
    typer.echo(f"wrote {len(compiled.jobs)} jobs to {out}", err=True)


@app.command()
def graph(
    plan: PlanArg,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="dot (Graphviz) or mermaid")] = GraphFormat.dot,
    set_: SetOpt = None,
) -> None:
    """Print PLAN's job graph: an edge from each producer to each job that requires its outputs."""
    from plancompiler.graph import to_dot, to_mermaid

    compiled = _compile(plan, set_, None, lint=False)
    if compiled.graph is None:
        raise typer.Exit(_report([compiled], Format.text, False))
    graph_ = compiled.graph
    typer.echo(to_dot(graph_, compiled.name) if fmt is GraphFormat.dot else to_mermaid(graph_), nl=False)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the YAML plan format, for editors (yaml-language-server)."""
    from plancompiler.models import Plan

    typer.echo(json.dumps(Plan.model_json_schema(by_alias=True), indent=1))


HostsOpt = Annotated[
    Path | None, typer.Option("--hosts", metavar="FILE", help="hosts file (default $PLAN_HOSTS, else plans/hosts.yaml)")
]
HostArg = Annotated[
    str, typer.Argument(help="a name from the hosts file, a path (./q, /srv/jobs), or DEST:PATH", metavar="HOST")
]


def _host(spec: str, hosts: Path | None):
    """HOST resolved; a hosts-file mistake is a located error, exit 2."""
    from plancompiler.hosts import resolve

    try:
        return resolve(spec, hosts)
    except PlanError as exc:
        raise _fail(str(exc)) from exc


@contextlib.contextmanager
def _host_errors() -> Iterator[None]:
    """A host that cannot be reached exits 3; a command that failed or was refused there exits 1."""
    from plancompiler.backends.protocol import Refused
    from plancompiler.commands.operate import OperateError
    from plancompiler.hosts import RemoteFailed, Unreachable

    try:
        yield
    except Unreachable as exc:
        raise _fail(f"unreachable: {exc}", 3) from exc
    except (RemoteFailed, Refused) as exc:
        raise _fail(str(exc), 1) from exc
    except OperateError as exc:
        raise _fail(str(exc), exc.code) from exc
    except PlanError as exc:
        raise _fail(str(exc)) from exc


def _call(host, mode: str, request: dict, timeout: float | None = None) -> dict:
    with _host_errors():
        result = host.call(mode, request, timeout)
    if "error" in result:
        raise _fail(f"{host.describe()}: {result['error']}", 1)
    return result


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
    no_verify_external: Annotated[
        bool, typer.Option("--no-verify-external", help="do not check that the plan's external paths exist on the host")
    ] = False,
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
) -> None:
    """Check PLAN, diff it against HOST's queue, print the diff, then install it atomically.

    Marks: + new, ~ changed, = unchanged, - retired (removed unless --no-prune), ! held (failed),
    r retried (--retry-failed), > running (left alone), >~ running but changed (reported), d done.
    A job of the same name that another plan owns is not replaced without --take-over. Pushes to one
    host take turns (--lock-wait); one whose queue changed after it looked is refused. A warning says
    when the runner there is stopped, dead, never started, or parked (--json: host_state).
    Nothing is sent unless the whole plan checks clean. Exit 0 ok, 1 refused, 3 host unreachable.
    """
    from plancompiler.push import PushOptions
    from plancompiler.push import push as push_plan

    target = _host(host, hosts)
    compiled = _compile(plan, set_, templates)
    code = _report([compiled], Format.text, strict)
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
    )

    def show(diff) -> None:
        typer.echo(json.dumps(diff.to_json(), indent=1) if as_json else diff.text())

    with _host_errors():
        outcome = push_plan(compiled, target, options, show)
    for line in outcome.results:
        typer.echo(line)
    for note in outcome.notes:
        typer.echo(note, err=True)
    if outcome.diff.errors:
        raise typer.Exit(1)


@app.command("run")
def run_plan(
    plan: PlanArg,
    root: Annotated[Path | None, typer.Option("--root", help="local queue root (default .plan/<plan name>)")] = None,
    set_: SetOpt = None,
    templates: TemplatesOpt = None,
    tick: Annotated[float, typer.Option("--tick", help="runner tick in seconds")] = 0.5,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="re-queue failed jobs first")] = False,
) -> None:
    """Check PLAN, push it to a local queue, and run the bundled runner until nothing more can run.

    Prints events as they happen and a summary table; exit 0 only when every job of the plan is done.
    """
    from plancompiler.commands.run import run_queue
    from plancompiler.hosts import Host
    from plancompiler.push import PushOptions
    from plancompiler.push import push as push_plan

    compiled = _compile(plan, set_, templates)
    code = _report([compiled], Format.text, False)
    if code:
        typer.echo(f"plan: not run: {plan} has errors", err=True)
        raise typer.Exit(code)
    queue_root = (root or Path(".plan") / compiled.name).resolve()
    target = Host(name=str(queue_root), root=str(queue_root))

    def show(diff) -> None:
        typer.echo(diff.text())

    with _host_errors():  # no warning about the runner: this command starts one now
        outcome = push_plan(compiled, target, PushOptions(retry_failed=retry_failed, expect_runner=False), show)
    if outcome.diff.errors:
        raise typer.Exit(1)
    summary = run_queue(queue_root, [j.filename for j in compiled.jobs], tick=tick, echo=typer.echo)
    typer.echo("")
    typer.echo(summary.table())
    raise typer.Exit(0 if summary.ok else 1)


@app.command()
def status(
    host: HostArg,
    hosts: HostsOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the host's status.json, counts and recent events as JSON")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds the probe may take in all")] = 60.0,
) -> None:
    """What each lane runs, why each queued job waits and since when, recent ends, runner heartbeat.

    One bounded round trip. Exit 0, 1 if the queue cannot be read, 3 if the host is unreachable.
    """
    from plancompiler.backends import backend_for
    from plancompiler.watch import status_text

    target = _host(host, hosts)
    with _host_errors():
        answer = backend_for(target).status({"offset": -1}, timeout)
    if "error" in answer:
        raise _fail(f"{target.describe()}: {answer['error']}", 1)
    if as_json:
        typer.echo(
            json.dumps(
                {k: answer.get(k) for k in ("status", "counts", "events", "runner_alive", "now", "parked")}, indent=1
            )
        )
    else:
        typer.echo(status_text(target, answer))
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
_SECONDS = "SECONDS"


@app.command()
def watch(
    host: HostArg,
    hosts: HostsOpt = None,
    interval: Annotated[float, typer.Option("--interval", metavar=_SECONDS, help="seconds between probes")] = 120.0,
    once: Annotated[bool, typer.Option("--once", help="probe once and exit (for cron)")] = False,
    probe_timeout: Annotated[
        float, typer.Option("--probe-timeout", metavar=_SECONDS, help="seconds one probe may take in all")
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
        float, typer.Option("--stall", metavar=_SECONDS, help="seconds a net job may run before STALL")
    ] = 3600.0,
    idle: Annotated[
        float, typer.Option("--idle", metavar=_SECONDS, help="seconds of nothing running before IDLE")
    ] = 600.0,
    dead: Annotated[
        float, typer.Option("--dead", metavar=_SECONDS, help="heartbeat age in seconds that means DEAD")
    ] = 300.0,
    unreachable: Annotated[
        int, typer.Option("--unreachable", metavar="N", help="failed probes in a row before UNREACHABLE")
    ] = 5,
    parked_repeat: Annotated[
        float, typer.Option("--parked-repeat", metavar=_SECONDS, help="seconds before a lasting park is reported again")
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
        float, typer.Option("--realert", metavar=_SECONDS, help="seconds before an open incident is sent again")
    ] = 3600.0,
    hook_timeout: Annotated[
        float, typer.Option("--hook-timeout", metavar=_SECONDS, help="seconds --on-alert/--ping may run")
    ] = 30.0,
    ping: Annotated[
        str | None,
        typer.Option(
            "--ping",
            metavar="CMD",
            help="run CMD after every successful probe (a dead-man's switch for the watcher itself)",
        ),
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
    """Probe HOST every --interval seconds; judge new events and what is true now; print `KIND: detail` lines.

    Kinds and exit codes: EVENT 10 (new events of the alerting kinds), STALL 11 (a net job past --stall
    or any job past its WARN_AFTER), IDLE 12, BLOCKED 13 (a job that can never run), DEAD 14 (runner
    heartbeat older than --dead, no runner process, or on Slurm a controller that does not answer),
    UNREACHABLE 15 (--unreachable failed probes in a row), ERROR 16 (reached the host but could not read
    the queue), PARKED 17, WAITING 18 (a queued job held longer than --waiting by one reason that is not
    the queue's own order). Every kind but EVENT is an incident per job, lane or host: it is sent when it
    opens and every --realert while it lasts, and RECOVERED (exit 0) is sent when it clears. Without
    --on-alert the watcher exits on the first alert; --once exits 0 when there is nothing new.
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

    target = _host(host, hosts)
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
        raise _fail(str(exc)) from exc
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
    )
    with _host_errors():  # a bad --probe-timeout is a usage error before any probe
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
) -> None:
    """Silence one open incident `plan watch` knows of, until it changes, recovers, or --for passes.

    Exit 0 when acked, 1 when no open incident (or more than one) matches, 2 for an unknown kind.
    """
    import time

    from plancompiler.watch import AckError, WatchState, duration, state_path
    from plancompiler.watch import ack as ack_incident

    target = _host(host, hosts)
    path = state or state_path(target)
    try:
        seconds = duration("--for", for_) if for_ else None
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    book = WatchState.load(path)
    now = time.time()
    try:
        found = ack_incident(book.incidents, incident, now + seconds if seconds else None, now)
    except AckError as exc:
        raise _fail(str(exc), exc.code) from exc
    book.save(path)
    typer.echo(
        f"acked {found.kind}:{found.subject} on {target.name} "
        + (f"for {for_}" if for_ else "until it changes or recovers")
        + f": {found.detail}"
    )


@app.command()
def report(
    source: Annotated[
        str, typer.Argument(help="an events.jsonl file, or a HOST (name, path or DEST:PATH)", metavar="HOST|EVENTS")
    ],
    hosts: HostsOpt = None,
    since: Annotated[str | None, typer.Option("--since", help="start, 'YYYY-MM-DD HH:MM:SS' (local time)")] = None,
    until: Annotated[str | None, typer.Option("--until", help="end, 'YYYY-MM-DD HH:MM:SS' (local time)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    html_file: Annotated[
        Path | None, typer.Option("--html", metavar="FILE", help="also write a self-contained HTML timeline")
    ] = None,
    plan: Annotated[str | None, typer.Option("--plan", help="only this plan's jobs (Slurm hosts)")] = None,
) -> None:
    """Where each lane's time went: busy, idle, and idle with work waiting, split by cause.

    Causes: the exclusive lane's job, a foreign GPU process, a REQUIRES that later held or never held,
    blocked, backoff, runner down. Then each job's attempts and outcome, failure clusters, and the
    longest silences. Reads the seed's events too (lane states then marked as inferred).
    """
    from plancompiler.report import build_report, file_liveness, liveness, parse_events, parse_ts, render_html

    answer: dict = {}
    path = Path(source)
    if path.is_file():
        text = path.read_text(errors="replace")
    else:
        target = _host(source, hosts)
        if target.backend == "slurm":  # the ledger's attempts with Slurm's clocks; --plan picks one plan
            from plancompiler.backends.slurm import SlurmBackend

            with _host_errors():
                found = SlurmBackend(target).report_source(since, plan)
            text = found.text
            for note in found.notes:
                typer.echo(note, err=True)
        else:
            answer = _call(target, "status", {"offset": 0, "max_bytes": 1 << 30}, 300)
            text = "\n".join(json.dumps(e) for e in answer.get("events", []))
    try:
        start = parse_ts(since) if since else None
        end = parse_ts(until) if until else None
        events, skipped = parse_events(text, source, empty_ok=not path.is_file())
        live = file_liveness(path) if path.is_file() else liveness(answer)
        result = build_report(events, start, end, live=live, skipped=skipped)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps(result.to_json(), indent=1) if as_json else result.text())
    if html_file:
        html_file.write_text(render_html(result))
        typer.echo(f"wrote {html_file}", err=True)


JobArg = Annotated[str, typer.Argument(help="the job's name (with or without .job)", metavar="JOB")]


@app.command()
def park(
    host: HostArg,
    hosts: HostsOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="why: shown in status, events and by watch")] = "",
    now: Annotated[
        bool, typer.Option("--now", help="also end running jobs and put them back in queue/ (no attempt used)")
    ] = False,
) -> None:
    """Stop HOST's runner from starting new jobs (running jobs finish unless --now), e.g. for reboot-per-side work.

    `plan watch` reports PARKED once, and again while the park lasts; lift it with `plan unpark`.
    """
    from plancompiler.commands import operate

    target = _host(host, hosts)
    with _host_errors():
        typer.echo(operate.park(target, reason, now))


@app.command()
def unpark(host: HostArg, hosts: HostsOpt = None) -> None:
    """Let HOST's runner start jobs again."""
    from plancompiler.commands import operate

    target = _host(host, hosts)
    with _host_errors():
        typer.echo(operate.unpark(target))


@app.command()
def retry(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner to take the request")] = 30.0,
) -> None:
    """Move JOB from failed/ back to queue/ with its attempts reset; the runner does it and logs `retry`."""
    from plancompiler.commands import operate

    target = _host(host, hosts)
    with _host_errors():
        typer.echo(operate.retry(target, job, wait))


@app.command()
def cancel(
    host: HostArg,
    job: JobArg,
    hosts: HostsOpt = None,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner to take the request")] = 30.0,
) -> None:
    """Remove a queued JOB, or end a running one's whole tree and file it in failed/ (`cancelled` event)."""
    from plancompiler.commands import operate

    target = _host(host, hosts)
    with _host_errors():
        typer.echo(operate.cancel(target, job, wait))


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

    target = _host(host, hosts)
    with _host_errors():
        state = operate.logs(target, job, lines, follow, interval, lambda text: typer.echo(text, nl=False))
    if follow:
        typer.echo(f"-- {operate.job_file(job)} is {state or 'gone'}", err=True)


@app.command()
def bootstrap(
    host: HostArg,
    hosts: HostsOpt = None,
    user_unit: Annotated[bool, typer.Option("--user", help="a systemd --user unit instead of a system one")] = False,
    run_as: Annotated[str | None, typer.Option("--run-as", help="User= of a system unit (default: ssh user)")] = None,
    python: Annotated[str, typer.Option("--python", help="interpreter on the host")] = "/usr/bin/python3",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be done and change nothing")] = False,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for the runner's first heartbeat")] = 30.0,
) -> None:
    """Install the standard-library runner under HOST's queue root and its systemd unit, then wait for a heartbeat.

    Idempotent. Where systemd is not running, it says exactly what to run instead.
    """
    from plancompiler.commands import operate

    target = _host(host, hosts)
    plan = operate.bootstrap_plan(target, user_unit, run_as, python)
    typer.echo("\n".join(plan.lines))
    if dry_run:
        typer.echo(plan.unit)
        typer.echo("dry run: nothing was changed", err=True)
        return
    with _host_errors():
        for line in operate.bootstrap(target, plan, user_unit, python, wait):
            typer.echo(line)


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
    from plancompiler.commands.operate import pre_push_hook

    git_dir = repo / ".git"
    if not git_dir.is_dir():
        raise _fail(f"{repo} is not a git repository (no .git directory)")
    hook = git_dir / "hooks" / "pre-push"
    hook.parent.mkdir(exist_ok=True)
    if hook.exists() and "plan hooks install" not in hook.read_text(errors="replace"):
        raise _fail(f"{hook} exists and was not written by plan: add `plan check` to it by hand", 1)
    hook.write_text(pre_push_hook(sys.executable, plans))
    hook.chmod(0o755)
    typer.echo(f"wrote {hook}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"plan {__version__}")
        raise typer.Exit(0)


_GLOBAL: dict[str, Any] = {"debug": False, "limits": None, "max_size": None}


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="on an internal error, print its traceback")] = False,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size",
            metavar="SIZE",
            help="most bytes one rendered value or job may have (default 1M; e.g. 4M) for check, render, push and run",
        ),
    ] = None,
) -> None:
    """plan: typed job plans in, checked job files out, and the queue they run in."""
    _GLOBAL["debug"] = debug
    _GLOBAL["limits"] = None
    _GLOBAL["max_size"] = max_size
    if not max_size:
        return
    from plancompiler.sandbox import Limits, parse_size  # jinja2: only when a limit is given

    try:
        _GLOBAL["limits"] = Limits(max_size=parse_size(max_size))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-size") from exc


@functools.cache
def command() -> Any:
    """The click command typer builds from every command's signature (~25 ms), built once per process."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> int:
    from plancompiler import lightcli

    args = sys.argv[1:] if argv is None else list(argv)
    light = lightcli.read(app, _root, args)
    if light is not None:
        try:
            code = lightcli.run(_root, *light)
        except Exception as exc:  # never a traceback and never exit 1 for a bug of ours
            _internal(None, exc)
            return 2
        if code is not None:
            return code
    try:
        command()(args=args, prog_name="plan")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:  # never a traceback and never exit 1 for a bug of ours
        _internal(None, exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
