"""`plan top`: every host's queue live on one screen."""

from __future__ import annotations

from typing import Annotated

import typer

from plancompiler.cli.shared import HostsOpt, app, fail, resolve_host


@app.command()
def top(
    host: Annotated[
        list[str] | None,
        typer.Argument(help="hosts to show (default: every host in the hosts file)", metavar="HOST"),
    ] = None,
    hosts: HostsOpt = None,
    interval: Annotated[
        float | None,
        typer.Option("--interval", metavar="SECONDS", help="seconds between probes (default 2 local, 10 over ssh)"),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit (for scripts)")] = False,
) -> None:
    """Every host's queue live on one screen: runners, incidents, running jobs with progress and estimated ends,
    waiting jobs grouped by reason, recent ends; refreshed by `plan watch`'s bounded probes.

    Keys: q quit, j/k or arrows select, l log, a ack the selected incident, r retry / c cancel (asks first),
    / filter. Not a terminal: a plain frame each interval. Exit 0; with --once 3 when no host answered, 1 when
    one was reached but its queue could not be read (a root that does not exist).
    """
    from plancompiler.hosts import hosts_file
    from plancompiler.top import TopOptions, run_top
    from plancompiler.watch import state_path

    names = list(host or [])
    if not names:
        path = hosts_file(hosts)
        if path is None or not path.exists():
            raise fail("top: name a HOST, or give a hosts file (--hosts, $PLAN_HOSTS or plans/hosts.yaml)")
        from plancompiler.hostsfile import load_hosts

        names = list(load_hosts(path))
        if not names:
            raise fail(f"top: {path} names no host")
    targets = [resolve_host(name, hosts) for name in names]
    if interval is not None and not interval > 0:
        raise fail(f"--interval must be more than 0 seconds, not {interval:g}")
    raise typer.Exit(run_top(targets, TopOptions(interval=interval, once=once), state_path))
