"""`python3 -m runner run|status|unit|agent`: the runner's command line, parsed by `runner.cli`, dispatched here."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from runner.files import DIR_MODE, SHARED_DIR_MODE, make_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from runner.cli import build_parser, config_from

__all__ = ["build_parser", "config_from", "main"]


def __getattr__(name: str) -> object:
    """`build_parser` and `config_from`, from runner.cli when asked for: an agent's start never builds the parser
    (argparse, the `run` flags and their `Config` defaults: about a third of its start-up)."""
    if name in ("build_parser", "config_from"):
        from runner import cli

        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if len(words) == 3 and words[0] == "agent" and not any(w.startswith("-") for w in words[1:]):
        # `agent MODE ROOT`, as every `plan` call over ssh sends it (~150 starts a test run): what argparse
        # would make of it, without building the parser of every other command.
        from runner.agent.dispatch import main as agent_main

        return agent_main(words[1:])
    from runner.cli import build_parser

    args = build_parser().parse_args(argv)
    if args.command == "agent":
        from runner.agent.dispatch import main as agent_main

        return agent_main([args.mode, args.root])
    if args.command == "run":
        return _run(args)
    if args.command == "status":
        return _status(args)
    if args.command == "gpus":
        return _gpus(args)
    from runner.agent.unit import unit_text

    package_parent = str(Path(__file__).resolve().parent.parent)
    try:
        print(unit_text(os.path.realpath(args.root), args.python, package_parent, args.user, args.tick), end="")
    except ValueError as exc:
        print(f"runner: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> int:
    from runner.cli import config_from
    from runner.errors import RunnerError
    from runner.service.loop import serve
    from runner.service.runner import Runner

    if args.lanes and any(lane not in args.lanes for lane in args.exclusive):
        print(f"runner: --exclusive names a lane not in --lanes: {','.join(args.exclusive)}", file=sys.stderr)
        return 2
    unknown = [lane for lane in args.slots if lane not in args.lanes]
    if unknown:
        print(f"runner: --slots names a lane not in --lanes: {','.join(unknown)}", file=sys.stderr)
        return 2
    if not args.lanes:
        print("runner: --lanes names no lane: give at least one (e.g. net,gpu,cpu)", file=sys.stderr)
        return 2
    if args.tick <= 0:
        print("runner: --tick must be above 0 (a scan every 0 s would never rest)", file=sys.stderr)
        return 2
    metrics_dir = os.path.dirname(os.path.realpath(args.metrics)) if args.metrics else ""
    if args.metrics and not os.path.isdir(metrics_dir):
        print(f"runner: --metrics {args.metrics}: no directory {metrics_dir}", file=sys.stderr)
        return 2
    try:
        _make_root(args.root, args.group_share)
        args.root = Path(os.path.realpath(args.root))  # once: the jobs run with it as their working directory
    except OSError as exc:
        print(f"runner: cannot use --root {args.root}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    urls = [*args.notify, *([args.ping] if args.ping else [])]
    if urls:  # checked before the runner starts; urllib is loaded only by a runner that sends
        from runner.alerts.notify import BadTarget, target

        try:
            for url in urls:
                target(url)
        except BadTarget as exc:
            print(f"runner: --notify/--ping: {exc}", file=sys.stderr)
            return 2
    try:
        return serve(Runner(config_from(args)))
    except RunnerError as exc:  # the one handler at the runner's edge
        print(f"runner: {exc}", file=sys.stderr)
        return exc.code


def _make_root(root: Path, group_share: bool) -> None:
    """ROOT made with its mode exactly (0700; 2770 with --group-share); an existing root of ours is made 2770
    with --group-share, and otherwise left as it is for the trust check to judge."""
    mode = SHARED_DIR_MODE if group_share else DIR_MODE
    if not root.is_dir():
        make_dirs(str(root), mode)
    elif group_share and root.stat().st_uid == os.geteuid():
        os.chmod(root, mode)


def _status(args: argparse.Namespace) -> int:
    from runner.files import read_json
    from runner.queue import Queue, fresh_status
    from runner.readers import runner_alive, runner_stopped, status_problem
    from runner.views.status import render_status, runner_down

    if not os.path.isdir(args.root):
        what = "does not exist" if not os.path.lexists(args.root) else "is not a directory"
        print(f"runner: --root {args.root} {what}: give a queue root", file=sys.stderr)
        return 2
    path = args.root / "status.json"
    try:
        status = fresh_status(args.root, read_json(path), every=args.all or args.json)
    except ValueError as exc:
        print(f"runner: {path}: not JSON: {exc}", file=sys.stderr)
        return 1
    if status is None:
        print(f"runner: no status.json under {args.root}: has a runner ever run there?", file=sys.stderr)
        return 1
    problem = status_problem(status)
    if problem:
        print(f"runner: {path} is corrupt: {problem}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=1))
        return 0
    text = render_status(status, time.time(), args.all)
    if not runner_alive(status):  # as `plan status` says it: stopped cleanly (when, why) or dead
        queued = len(Queue(args.root).jobs("queue"))
        text = runner_down(status, runner_stopped(str(args.root), status), queued) + "\n" + text
    print(text)
    return 0


def _gpus(args: argparse.Namespace) -> int:
    """What the runner sees of the GPUs: two samples --window apart, judged as the gpu lane judges them."""
    from runner import procs
    from runner.digest import sha1_hex
    from runner.service.gpu import GpuRules, GpuWatch, Roots, find_devices, gpu_status
    from runner.views.status import gpu_lines

    roots = Roots(args.gpu_proc, args.gpu_sys, args.gpu_dev)
    watch = GpuWatch(
        GpuRules(args.gpu_names, args.gpu_ignore, args.window, args.gpu_memory, tuple(args.gpu_device), roots)
    )
    prefix = sha1_hex(os.fsencode(os.path.realpath(args.root)))[:12] + ":" if args.root else None

    def owner(proc: procs.Proc) -> str | None:
        if prefix and proc.tag and proc.tag.startswith(prefix):
            return proc.tag.rsplit(":", 1)[-1]
        return None

    watch.observe(time.time(), procs.all_stats(), owner)
    time.sleep(args.window)
    now = time.time()
    seen = watch.observe(now, procs.all_stats(), owner)
    status = gpu_status(seen, [])
    if args.json:
        status["nodes"] = {str(d.index): list(d.nodes) for d in find_devices(roots)}
        print(json.dumps(status, indent=1))
        return 0
    devices = find_devices(roots)
    if not devices:
        print(f"no GPU under {roots.sys}/class/drm or bound to nvidia (NVML: {seen.nvml})")
    for d in devices:
        print(f"gpu {d.index}: {d.pci} {d.driver or '?'}  nodes {' '.join(d.nodes) or '-'}")
    print("\n".join(gpu_lines(status, now)[1:]) or "no process holds a GPU node")
    for h in seen.holders:
        where = ",".join(map(str, h.devices)) or "any"
        print(f"  pid {h.pid} {h.who}{' ' + h.job if h.job else ''} gpu {where}: {h.why}  | {h.cmd[:80]}")
    if seen.unreadable:
        print(f"  {len(seen.unreadable)} processes' open files cannot be read by this user (run as root to see them)")
    print(f"  NVML: {seen.nvml}" + ("" if seen.nvml != "absent" else " (nvidia-ml-py not installed or no NVIDIA GPU)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
