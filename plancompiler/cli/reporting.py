"""`plan report`: where each lane's time went, from a host or an events file."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from plancompiler.cli.shared import HostsOpt, app, fail, output_file, resolve_host


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

    Causes: the exclusive lane's job, a foreign GPU process, a REQUIRES that came true later or never did,
    blocked, backoff, runner down. Then each job's attempts and outcome, failure clusters, and the
    longest silences. Reads the seed's events too (lane states then marked as inferred).
    """
    from plancompiler.backends import backend_for
    from plancompiler.report import EventLines, build_report, file_liveness, liveness, parse_ts, render_html

    if html_file is not None:
        output_file(html_file, "--html")
    status: dict = {}
    path = Path(source)
    text = ""
    is_file = os.path.isfile(path)  # never raises (a name too long is a host name, then refused as one)
    if not is_file:  # a host: its events.jsonl, or a Slurm ledger's attempts (--plan picks one plan)
        target = resolve_host(source, hosts)
        found = backend_for(target).report_source(since, plan)
        text, status = found.text, found.status
        for note in found.notes:
            typer.echo(note, err=True)
    try:
        start = parse_ts(since) if since else None
        end = parse_ts(until) if until else None
        live = file_liveness(path) if is_file else liveness(status)
        # A file is read line by line (a million lines are never held whole), and --since skips its lines
        # long before the window unparsed; a host's answer (in its zone) is read as it came.
        with open(path, errors="replace") if is_file else contextlib.nullcontext(text.splitlines()) as lines:
            events = EventLines(lines, start if is_file else None)
            result = build_report(events, start, end, live=live, zone=status.get("zone"))
        events.check(source, empty_ok=not is_file)
        result.skipped[:0] = events.skipped()
    except OSError as exc:
        raise fail(f"{source}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if not events.events:  # a host's queue no runner has run yet (a file with no events was refused above)
        said = "no events yet: no runner has run this queue"
        if as_json:
            typer.echo(json.dumps({**result.to_json(), "start": None, "end": None, "notes": [said]}, indent=1))
        else:
            typer.echo(f"{source}: {said}")
        if html_file:
            typer.echo(f"{html_file} not written: {said}", err=True)
        return
    typer.echo(json.dumps(result.to_json(), indent=1) if as_json else result.text())
    if html_file:
        try:
            html_file.write_text(render_html(result))
        except OSError as exc:  # a FIFO, a symlink loop, a full disk
            raise fail(f"--html {html_file}: {exc.strerror or exc}") from exc
        typer.echo(f"wrote {html_file}", err=True)
