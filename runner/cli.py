"""The runner's command line, parsed: `build_parser` and the `Config` a `run` asks for (with `__main__`, the only
modules that import argparse)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from runner import banner
from runner.config import Config
from runner.durations import format_duration, parse_duration
from runner.files import MODES_HELP, not_replaceable

_DEFAULTS = Config(root=Path("."))


def _rewritten_file(text: str) -> Path:
    if problem := not_replaceable(text):  # a device, a FIFO: the rewrite would replace it
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def _duration(text: str) -> float:
    try:  # a threshold or tick over a year is a typo (and past what select() can wait)
        return parse_duration(text, at_most=366 * 86400)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _slots(text: str) -> dict[str, int]:
    """`cpu=4,net=2`: how many jobs each named lane runs at once."""
    slots: dict[str, int] = {}
    for item in _csv(text):
        lane, sep, count = item.partition("=")
        if not sep or not lane.strip() or not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: want LANE=N with N a whole number >= 1 (e.g. cpu=4,net=2)")
        slots[lane.strip()] = int(count)
    return slots


class _Version(argparse.Action):
    """--version, worked out only when asked (reading the commit from git costs a process start)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(banner("runner"))
        parser.exit(0)


def _gpu_list(text: str) -> tuple[int, ...]:
    """`0,1`: the GPUs the gpu lane gives its jobs, by index."""
    found: list[int] = []
    for item in _csv(text):
        if not (item.isascii() and item.isdigit()) or int(item) in found:
            raise argparse.ArgumentTypeError(f"{item!r}: want GPU indexes such as 0,1 (each once)")
        found.append(int(item))
    return tuple(found)


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    """`1G`, `512M`, `2GiB`, `1048576`: a number of bytes."""
    lowered = text.strip().lower()
    for suffix in ("ib", "b"):
        if lowered.endswith(suffix) and lowered[: -len(suffix)][-1:] in "kmgt" and len(lowered) > len(suffix):
            lowered = lowered[: -len(suffix)]
            break
    unit = lowered[-1:] if lowered[-1:] in "kmgt" else ""
    number = lowered[: len(lowered) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use 512M, 1G or a number of bytes)") from None
    if not 0 <= value < 1e18:  # nan, inf and more than an exabyte are no sizes
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use 512M, 1G or a number of bytes)")
    return int(value * _SIZE_UNITS[unit])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m runner",
        description="The queue runner: runs bash job files from ROOT/queue in lanes, "
        "records events.jsonl and status.json, and says why every waiting job waits.",
        epilog="Durations read 90, 90s, 10m, 6h or 2d. " + MODES_HELP,
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version, commit and formats, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_others(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run the queue in the foreground until SIGTERM",
        description="Run the queue under ROOT until SIGTERM or SIGINT. On stop, running jobs "
        "are ended and go back to queue/ without using an attempt.",
        epilog="Durations read 90, 90s, 10m, 6h or 2d. Retry n waits backoff-base * 2**(n-1), at most "
        "backoff-max. " + MODES_HELP,
    )
    run.add_argument("--root", required=True, type=Path, help="queue root (holds queue/ running/ done/ failed/ logs/)")
    d = _DEFAULTS

    def add(flag: str, default: float, text: str) -> None:
        run.add_argument(
            flag,
            type=_duration,
            default=default,
            metavar="DURATION",
            help=f"{text} (default {format_duration(default)})",
        )

    add("--tick", d.tick_s, "how often the queue is scanned; a job's exit wakes the runner at once")
    add("--sweep-budget", d.sweep_budget_s, "each tick's time judging waiting jobs (a large queue: over ticks)")
    run.add_argument(
        "--lanes", type=_csv, default=d.lanes, help=f"lanes, in the order they pick jobs (default {','.join(d.lanes)})"
    )
    run.add_argument(
        "--slots",
        type=_slots,
        default={},
        metavar="LANE=N,...",
        help="jobs a lane runs at once, e.g. cpu=4,net=2 (default 1 each); an exclusive lane still "
        "excludes the others while any of its slots is busy",
    )
    run.add_argument(
        "--exclusive",
        type=_csv,
        default=d.exclusive,
        help=f"lanes of which at most one runs at a time (default {','.join(d.exclusive)}; '' for none)",
    )
    _add_gpu(run, add)
    _add_thresholds(run, add)
    _add_ownership(run)
    run.add_argument(
        "--metrics",
        type=_rewritten_file,
        default=None,
        metavar="FILE",
        help="rewrite FILE every tick with the queue's metrics in Prometheus's text format, e.g. "
        "/var/lib/node_exporter/textfile/plan.prom for node_exporter's textfile collector",
    )
    _add_alerting(run, add)


def _add_alerting(run: argparse.ArgumentParser, add: Callable[[str, float, str], None]) -> None:
    d = _DEFAULTS
    run.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="URL",
        help="send each incident's open, repeat and recovery here (repeatable): an http(s):// URL gets a JSON "
        "POST (a generic webhook); ntfy://HOST/TOPIC, ntfys://HOST/TOPIC or https://ntfy.sh/TOPIC gets ntfy's "
        "plain-text form",
    )
    run.add_argument(
        "--ping",
        default=None,
        metavar="URL",
        help="a dead-man's switch (healthchecks.io style): POST a one-line state here every --ping-every",
    )
    add("--ping-every", d.ping_every_s, "how often --ping is sent")
    add("--realert", d.realert_s, "an open incident is sent again this often (0: only once)")
    add("--parked-repeat", d.parked_repeat_s, "a parked queue's incident is sent again this often")
    add("--notify-timeout", d.notify_timeout_s, "one delivery's deadline (a failed one is tried again later)")
    run.add_argument(
        "--host-name",
        default=d.host_name,
        metavar="NAME",
        help="how notifications name this box, as `plan` names it (default: its host name)",
    )


def _add_gpu(run: argparse.ArgumentParser, add: Callable[[str, float, str], None]) -> None:
    d = _DEFAULTS
    run.add_argument(
        "--gpu-lane", default=d.gpu_lane, help=f"lane that waits for foreign GPU users (default {d.gpu_lane})"
    )
    run.add_argument(
        "--gpus",
        type=_gpu_list,
        default=None,
        metavar="N,...",
        help="the GPUs the gpu lane gives its jobs, one slot each (e.g. 0,1): a job gets its own in "
        "CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and PLAN_GPU, and a foreign user of one "
        "GPU holds only that one (default: the pushed plans' lanes.gpu.devices, else none: the lane's slots are "
        "counted, not GPUs)",
    )
    add("--gpu-window", d.gpu_window_s, "a foreign GPU holder blocks while its engine time rose within this long")
    add(
        "--gpu-stall",
        d.gpu_stall_s,
        "a running gpu job whose GPU engine time has not moved this long raises gpu-stalled (0: never)",
    )
    _add_gpu_reading(run)


def _add_gpu_reading(run: argparse.ArgumentParser) -> None:
    """The flags that say how GPU use is read and judged (`run` and `gpus`)."""
    d = _DEFAULTS
    run.add_argument(
        "--gpu-memory",
        type=_size,
        default=d.gpu_memory_bytes,
        metavar="SIZE",
        help="a foreign GPU holder with this much GPU memory blocks, busy or not (default 1G)",
    )
    run.add_argument(
        "--gpu-ignore",
        type=_csv,
        default=d.gpu_ignore,
        metavar="NAME,...",
        help="processes never taken for GPU users: display servers, compositors and GPU monitors (default "
        f"{','.join(d.gpu_ignore)}; '' for none). Shown in status as idle GPU holders",
    )
    for name, default, what in (
        ("proc", d.gpu_proc, "procfs"),
        ("sys", d.gpu_sys, "sysfs"),
        ("dev", d.gpu_dev, "the device directory"),
    ):
        run.add_argument(
            f"--gpu-{name}",
            default=default,
            metavar="DIR",
            help=f"{what} GPU use is read from (default {default}; a container reading its host's, or a test)",
        )
    run.add_argument(
        "--gpu-names",
        type=_csv,
        default=d.gpu_names,
        help=f"process names that count as GPU users (default {','.join(d.gpu_names)})",
    )
    run.add_argument(
        "--unreadable-gpu",
        choices=("report", "block"),
        default=d.unreadable_gpu,
        help="a process whose open files this runner cannot read (another user's, when not root) "
        "may be using the GPU: 'report' lists it in status.json as an unknown GPU user, 'block' also "
        f"holds the gpu lane for it (default {d.unreadable_gpu})",
    )
    run.add_argument(
        "--gpu-device",
        action="append",
        default=[],
        metavar="[N=]PATH",
        help="an extra path that counts as a GPU device node when a process has it open, of GPU N where given "
        "(repeatable)",
    )


def _add_ownership(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--group-share",
        action="store_true",
        help="share the root with its group: a root it creates is 2770 (setgid, group-writable), and what it "
        "creates under a shared root is 2770 or 0660; an existing root of ours is made 2770. Without it, "
        "0700 and 0600. Never world-writable",
    )
    run.add_argument(
        "--keep-leaks",
        action="store_true",
        help="let processes that escaped their job (cleared its tag, left its session) outlive it; "
        "by default they are ended when the job ends and named in orphans-killed",
    )
    run.add_argument(
        "--cgroup",
        default=None,
        metavar="DIR|auto",
        help="a cgroup v2 directory the runner may create children in (one per job, ended by "
        "cgroup.kill): the stronger form of process ownership; 'auto' uses the runner's own cgroup "
        "(a unit with Delegate=yes). Default: none; the environment tag and subreaper are used",
    )


def _add_others(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser(
        "status",
        help="print what runs and why each queued job waits",
        description="Read ROOT/status.json and print it; --json prints it raw.",
    )
    status.add_argument("--root", required=True, type=Path, help="queue root")
    status.add_argument("--json", action="store_true", help="print status.json as JSON")
    status.add_argument("--all", action="store_true", help="every waiting job on a line (default: grouped by reason)")

    unit = sub.add_parser(
        "unit",
        help="print a systemd unit for this runner",
        description="Print a systemd service unit that runs this runner on ROOT.",
    )
    unit.add_argument("--root", required=True, type=Path, help="queue root")
    unit.add_argument("--user", default=os.environ.get("USER", "root"), help="User= of the unit (default $USER)")
    unit.add_argument("--python", default="/usr/bin/python3", help="interpreter (default /usr/bin/python3)")
    unit.add_argument("--tick", default="10", help="--tick passed to the runner (default 10)")

    gpus = sub.add_parser(
        "gpus",
        help="print the GPUs this runner sees, who holds each and whether they use it",
        description="Sample every GPU holder twice, --window apart, and print each GPU (its busy %% and memory) "
        "and each holder: ours (a job's), foreign (and whether it uses the GPU, which holds the gpu lane) or "
        "ignored. The same reading the runner does before starting a gpu job.",
    )
    gpus.add_argument("--window", type=_duration, default=2.0, metavar="DURATION", help="between the samples (2s)")
    gpus.add_argument("--json", action="store_true", help="print what was seen as JSON")
    gpus.add_argument("--root", type=Path, default=None, help="queue root whose jobs' processes count as ours")
    _add_gpu_reading(gpus)

    agent = sub.add_parser(
        "agent",
        help="answer one `plan` request on ROOT (JSON on stdin and stdout)",
        description="The host side of `plan push/status/watch/park/logs/...`: MODE is the "
        "request (probe, install, status, ...; `session` reads one JSON request per line).",
    )
    agent.add_argument("mode", metavar="MODE")
    agent.add_argument("root", metavar="ROOT")


def _add_thresholds(run: argparse.ArgumentParser, add: Callable[[str, float, str], None]) -> None:
    d = _DEFAULTS
    warn_env = os.environ.get("REQUIRES_WARN_S")
    add("--condition-timeout", d.condition_timeout_s, "a REQUIRES/DONE_IF run by bash is killed after this: false")
    add("--kill-grace", d.kill_grace_s, "between TERM and KILL when ending a job's processes")
    add("--backoff-base", d.backoff_base_s, "wait before the first retry")
    add("--backoff-max", d.backoff_max_s, "longest wait between retries")
    add(
        "--requires-warn",
        float(warn_env) if warn_env else d.requires_warn_s,
        "a REQUIRES false this long raises requires-wait (env REQUIRES_WARN_S in seconds also sets it)",
    )
    add("--requires-repeat", d.requires_repeat_s, "requires-wait is repeated this often while it lasts")
    add("--blocked-repeat", d.blocked_repeat_s, "blocked is repeated this often while it lasts")
    add("--gpu-wait-repeat", d.gpu_wait_repeat_s, "gpu-wait is repeated this often while a foreign GPU user stays")
    add("--idle", d.idle_s, "nothing running while jobs wait (or a lane waiting) this long raises idle")
    add("--idle-repeat", d.idle_repeat_s, "idle is repeated this often while it lasts")
    add(
        "--warn-after-net",
        d.warn_after["net"],
        "net jobs running longer than this raise long-running (a job's WARN_AFTER wins)",
    )
    add("--long-running-repeat", d.long_running_repeat_s, "long-running is repeated this often")
    add("--stall", d.stall_s, "a running job whose log has not grown this long raises stalled")
    add("--stall-repeat", d.stall_repeat_s, "stalled is repeated this often")
    add("--correlate-window", d.correlate_window_s, "failures this close together are compared for a shared cause")
    run.add_argument(
        "--correlate-min",
        type=int,
        default=d.correlate_min,
        help="differently named jobs failing with the same line that raise correlated-failure "
        f"(default {d.correlate_min})",
    )
    add(
        "--settle",
        d.settle_s,
        "a job file not listed with its hash in manifest.json is taken once nothing has "
        "written to it this long (its mtime, or its size and mtime across scans); 0 takes files at once",
    )
    add(
        "--heartbeat-event-every",
        d.heartbeat_event_s,
        "a heartbeat event is written after this long without any other event (for downtime in reports)",
    )


def config_from(args: argparse.Namespace) -> Config:
    return Config(
        root=args.root,
        tick_s=args.tick,
        sweep_budget_s=args.sweep_budget,
        lanes=args.lanes,
        exclusive=args.exclusive,
        gpu_lane=args.gpu_lane,
        gpu_names=args.gpu_names,
        gpu_devices=tuple(args.gpu_device),
        gpu_ignore=args.gpu_ignore,
        gpu_window_s=args.gpu_window,
        gpu_memory_bytes=args.gpu_memory,
        gpu_stall_s=args.gpu_stall,
        gpu_proc=args.gpu_proc,
        gpu_sys=args.gpu_sys,
        gpu_dev=args.gpu_dev,
        gpus=list(args.gpus or ()),
        unreadable_gpu=args.unreadable_gpu,
        condition_timeout_s=args.condition_timeout,
        kill_grace_s=args.kill_grace,
        backoff_base_s=args.backoff_base,
        backoff_max_s=args.backoff_max,
        requires_warn_s=args.requires_warn,
        requires_repeat_s=args.requires_repeat,
        blocked_repeat_s=args.blocked_repeat,
        gpu_wait_repeat_s=args.gpu_wait_repeat,
        idle_s=args.idle,
        idle_repeat_s=args.idle_repeat,
        warn_after={"net": args.warn_after_net},
        long_running_repeat_s=args.long_running_repeat,
        stall_s=args.stall,
        stall_repeat_s=args.stall_repeat,
        correlate_window_s=args.correlate_window,
        correlate_min=args.correlate_min,
        settle_s=args.settle,
        keep_leaks=args.keep_leaks,
        heartbeat_event_s=args.heartbeat_event_every,
        slots=args.slots,
        cgroup=_cgroup(args.cgroup),
        host_name=args.host_name,
        realert_s=args.realert,
        parked_repeat_s=args.parked_repeat,
        notify=tuple(args.notify),
        ping=args.ping,
        ping_every_s=args.ping_every,
        notify_timeout_s=args.notify_timeout,
        metrics_path=Path(os.path.realpath(args.metrics)) if args.metrics else None,
    )


def _cgroup(value: str | None) -> str | None:
    """The cgroup for job children; with 'auto', the runner first moves itself into a leaf of its own cgroup."""
    from runner import cgroups

    if not value:
        return None
    path = cgroups.own_cgroup() if value == "auto" else value
    if not path or not cgroups.cgroup_usable(path):
        print(
            f"runner: --cgroup {value}: not a writable cgroup v2 directory with cgroup.kill; "
            "using the environment tag and subreaper only",
            file=sys.stderr,
        )
        return None
    if value == "auto":
        leaf = os.path.join(path, "runner")
        try:
            os.makedirs(leaf, exist_ok=True)
            with open(os.path.join(leaf, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))
        except OSError as exc:
            print(f"runner: --cgroup auto: cannot move into {leaf}: {exc}", file=sys.stderr)
            return None
    return path
