"""`python3 -m runner run|status|unit|agent`: the runner's command line, parsed by `runner.cli`, dispatched here."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from runner.cli import build_parser, config_from

__all__ = ["build_parser", "config_from", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "agent":
        from runner.agent.dispatch import main as agent_main

        return agent_main([args.mode, args.root])
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args)
    from runner.agent.unit import unit_text

    package_parent = str(Path(__file__).resolve().parent.parent)
    try:
        print(unit_text(str(args.root.resolve()), args.python, package_parent, args.user, args.tick), end="")
    except ValueError as exc:
        print(f"runner: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> int:
    from runner.service.loop import serve
    from runner.service.runner import AlreadyRunning, Runner

    if args.lanes and any(lane not in args.lanes for lane in args.exclusive):
        print(f"runner: --exclusive names a lane not in --lanes: {','.join(args.exclusive)}", file=sys.stderr)
        return 2
    unknown = [lane for lane in args.slots if lane not in args.lanes]
    if unknown:
        print(f"runner: --slots names a lane not in --lanes: {','.join(unknown)}", file=sys.stderr)
        return 2
    try:
        args.root.mkdir(parents=True, exist_ok=True)
        args.root = args.root.resolve()  # once: the jobs run with it as their working directory
    except OSError as exc:
        print(f"runner: cannot use --root {args.root}: {exc}", file=sys.stderr)
        return 2
    try:
        return serve(Runner(config_from(args)))
    except AlreadyRunning as exc:
        print(f"runner: {exc}", file=sys.stderr)
        return 3


def _status(args: argparse.Namespace) -> int:
    from runner.queue import fresh_status
    from runner.status import render_status

    path = args.root / "status.json"
    try:
        status = fresh_status(args.root, json.loads(path.read_text()))
    except FileNotFoundError:
        print(f"runner: no status.json under {args.root}: has a runner ever run there?", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"runner: {path}: not JSON: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.json else render_status(status, time.time(), args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
