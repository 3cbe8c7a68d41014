"""`plan run`: push a checked plan to a local queue and run the bundled runner until nothing more can run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import runner as runner_package
from runner.durations import format_duration
from runner.files import open_file
from runner.queue import fresh_status, timestamp
from runner.readers import terminal_safe
from runner.vocab import Event, Reason

_SHOWN = {
    e.value
    for e in (
        Event.START,
        Event.DONE,
        Event.FAILED,
        Event.RETRY,
        Event.SKIPPED,
        Event.INVALID,
        Event.TIMEOUT,
        Event.BLOCKED,
        Event.REQUIRES_WAIT,
        Event.GPU_WAIT,
        Event.ORPHANS_KILLED,
        Event.CORRELATED_FAILURE,
        Event.STALLED,
        Event.GPU_STALLED,
        Event.LONG_RUNNING,
        Event.IDLE,
    )
}
_STUCK = {r.value for r in (Reason.REQUIRES, Reason.BLOCKED, Reason.PARKED, Reason.GPU_FOREIGN, Reason.HELD)}


@dataclass
class RunSummary:
    jobs: list[str]
    states: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.states.get(j) == "done" for j in self.jobs)

    def table(self) -> str:
        width = max((len(j) for j in self.jobs), default=10)
        lines = [f"{'job':<{width}}  {'state':<8}  {'time':>7}  note"]
        for job in self.jobs:
            state = self.states.get(job, "?")
            took = self.durations.get(job)
            lines.append(
                f"{job:<{width}}  {state:<8}  {format_duration(took) if took is not None else '':>7}  "
                f"{self.reasons.get(job, '')}"
            )
        done = sum(self.states.get(j) == "done" for j in self.jobs)
        lines.append(f"{done}/{len(self.jobs)} done")
        return "\n".join(lines)


def _event_line(event: dict[str, Any]) -> str:
    kind = event["event"]
    job = event.get("job", "-")
    detail = ""
    if kind == Event.START:
        detail = f"lane {event.get('lane')}, attempt {event.get('attempt')}"
    elif kind in (Event.DONE, Event.FAILED, Event.RETRY):
        detail = f"rc {event.get('rc')}" + (f", {event.get('why')}" if event.get("why") else "")
        if event.get("tail") and kind != Event.DONE:
            detail += f": {event['tail'][-1][:100]}"
        if kind == Event.RETRY and isinstance(event.get("backoff_s"), (int, float)):
            of = f" of {event['retries']}" if isinstance(event.get("retries"), int) else ""
            detail += f" (attempt {event.get('next_attempt')}{of} in {format_duration(event['backoff_s'])})"
    elif kind == Event.BLOCKED:
        detail = event.get("why", "")
    elif kind == Event.CORRELATED_FAILURE:
        detail = event.get("message", "")
    elif kind == Event.INVALID:
        detail = event.get("reason", "")
    elif kind == Event.ORPHANS_KILLED:
        detail = ", ".join(event.get("cmds", []))[:100]
    return f"{event['ts'][11:]}  {kind:<14} {job}  {detail}".rstrip()


def run_queue(
    root: Path,
    jobs: list[str],
    tick: float = 0.5,
    echo: Callable[[str], None] = print,
    settle_s: float = 2.0,
    max_s: float | None = None,
) -> RunSummary:
    """Run the runner on ROOT until JOBS are all done or failed, or nothing can run; then stop it."""
    events_path = root / "events.jsonl"
    offset = events_path.stat().st_size if events_path.exists() else 0
    # the runner's output, with the root's file mode (0600, or the group's on a shared root) whatever the umask
    log = os.fdopen(open_file(str(root / "runner.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")
    proc = _start_runner(root, tick, log)
    watch = _Watch(root, jobs, echo, settle_s, max_s, proc)
    stopped_by: list[int] = []
    try:
        with _signals(catch=True):
            while True:
                time.sleep(0.2)
                offset = _follow(events_path, offset, watch.summary, echo)
                if watch.step():
                    break
    except KeyboardInterrupt as exc:  # Ctrl-C, or RunInterrupted
        stopped_by.append(exc.signum if isinstance(exc, RunInterrupted) else signal.SIGINT)
        raise
    finally:
        with _signals(catch=False):  # a second signal meanwhile does not leave the runner behind
            _stop_runner(proc)
        log.close()
        _follow(events_path, offset, watch.summary, echo)
        if stopped_by:
            name = signal.Signals(stopped_by[0]).name
            echo(f"plan: {name}: the run is stopped; its runner put the jobs it was running back in {root}/queue/")
    watch.final_states()
    return watch.summary


STOPPING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """`plan run` was sent SIGTERM or SIGHUP (a closed terminal, `timeout`, a CI cancel): its runner is stopped,
    and `plan` exits 128 + SIGNUM, as a shell reports a process that signal ended (130 for Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals(catch: bool) -> Iterator[None]:
    """CATCH: while the block runs, SIGTERM and SIGHUP end the run as Ctrl-C does (RunInterrupted); by default
    they ended `plan run` at once and left its runner serving the root for good. Otherwise TERM, HUP and INT are
    ignored while the block runs (the runner being stopped). In the main thread only: signals are caught there
    alone, and elsewhere the caller's own handling stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum: int, frame: object) -> None:
        raise RunInterrupted(signum)

    handlers = {signal.SIGTERM: end, signal.SIGHUP: end} if catch else dict.fromkeys(STOPPING, signal.SIG_IGN)
    before = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _start_runner(root: Path, tick: float, log: Any) -> subprocess.Popen[bytes]:
    """The bundled runner on ROOT, in a session of its own, writing to LOG."""
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(runner_package.__file__).resolve().parent.parent)
        + os.pathsep
        + os.environ.get("PYTHONPATH", ""),
    )
    # how it was started, as `plan status` says it (runner.how_started); it stops it by SIGTERM when the run ends
    env[runner_package.STARTED_ENV] = f"plan run (pid {os.getpid()}) at {timestamp(time.time())}"
    return subprocess.Popen(
        [sys.executable, "-m", "runner", "run", "--root", str(root), "--tick", str(tick)],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def _stop_runner(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Watch:
    """What `plan run` knows of the run while it follows the runner: one step per look at status.json."""

    def __init__(
        self,
        root: Path,
        jobs: list[str],
        echo: Callable[[str], None],
        settle_s: float,
        max_s: float | None,
        proc: subprocess.Popen[bytes],
    ) -> None:
        self.root, self.jobs, self.echo, self.proc = root, jobs, echo, proc
        self.settle_s, self.max_s = settle_s, max_s
        self.summary = RunSummary(jobs)
        for job in jobs:
            if (root / "done" / job).exists():
                self.summary.states[job] = "done"
                self.summary.reasons[job] = "already done"
        self.started = time.monotonic()
        self.stuck_since: float | None = None
        self.last_line = 0.0
        self.serving = proc.pid  # the runner whose status counts: ours, or the one that already serves ROOT

    def step(self) -> bool:
        """One look at the run; True when following it should end."""
        status = _read_status(self.root)
        if status and status.get("runner", {}).get("pid") != self.serving:
            status = None  # left by an earlier runner: wait for ours
        if self.serving == self.proc.pid and self.proc.poll() is not None:
            return not self._follow_other()
        running = (status or {}).get("running", [])
        mine = [q for q in (status or {}).get("queued", []) if q["job"] in self.jobs]
        if self._finished(status, running, mine) or self._stuck(status, running, mine):
            return True
        if running and time.monotonic() - self.last_line >= 5:
            self.last_line = time.monotonic()
            done = sum(self.summary.states.get(j) == "done" for j in self.jobs)
            lanes = ", ".join(f"{r['lane']}: {r['job']} {format_duration(r['elapsed_s'])}" for r in running)
            self.echo(f"          [{done}/{len(self.jobs)} done] {lanes}")
        if self.max_s is not None and time.monotonic() - self.started > self.max_s:
            self.echo(f"stopping after {format_duration(self.max_s)}")
            return True
        return False

    def _follow_other(self) -> bool:
        """Our runner exited: follow the runner that serves this root instead, if there is one."""
        other = _other_runner(self.root, self.proc.returncode)
        if other is None:
            self.echo(f"runner exited with {self.proc.returncode}; see {self.root / 'runner.log'}")
            return False
        # Another runner (a unit, a second `plan run`) serves this root: its ticks run our jobs.
        self.serving = other
        self.echo(
            f"another runner (pid {other}) already serves {self.root}: following it; stopping this command "
            "leaves it running"
        )
        return True

    def _finished(self, status: dict[str, Any] | None, running: list[Any], mine: list[Any]) -> bool:
        if all(self.summary.states.get(j) in ("done", "failed") for j in self.jobs):
            return True
        return bool(
            status
            and status.get("runner", {}).get("tick", 0) >= 2
            and not running
            and not mine
            and not any((self.root / "queue" / j).exists() for j in self.jobs)
        )

    def _stuck(self, status: dict[str, Any] | None, running: list[Any], mine: list[Any]) -> bool:
        """True once our queued jobs have all waited on something no run can change for SETTLE_S."""
        if not (status and not running and mine and all(q["reason"] in _STUCK for q in mine)):
            self.stuck_since = None
            return False
        self.stuck_since = self.stuck_since or time.monotonic()
        if time.monotonic() - self.stuck_since < self.settle_s:
            return False
        for q in mine:
            self.summary.states[q["job"]] = "waiting"
            self.summary.reasons[q["job"]] = f"{q['reason']}: {q['detail']}"[:120]
        return True

    def final_states(self) -> None:
        """Each job the events did not settle, as its queue directory says."""
        for job in self.jobs:
            if job in self.summary.states:
                continue
            for state in ("done", "failed", "queue", "running"):
                if (self.root / state / job).exists():
                    ended = "stopped" if self.serving == self.proc.pid else "running"  # another runner's run goes on
                    self.summary.states[job] = {"queue": "waiting", "running": ended}.get(state, state)
                    if state == "failed" and not self.summary.reasons.get(job):  # it failed in an earlier run
                        self.summary.reasons[job] = "failed before this run (--retry-failed runs it again)"


def _other_runner(root: Path, returncode: int | None) -> int | None:
    """The pid of the runner that holds ROOT's lock, when ours exited because of it (exit 3)."""
    if returncode != 3:
        return None
    status = _read_status(root)
    pid = (status or {}).get("runner", {}).get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return pid


def _follow(path: Path, offset: int, summary: RunSummary, echo: Callable[[str], None]) -> int:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    cut = data.rfind(b"\n") + 1
    for line in data[:cut].splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind, job = event.get("event"), event.get("job")
        if kind in (Event.DONE, Event.FAILED, Event.RETRY) and isinstance(event.get("duration_s"), (int, float)):
            summary.durations[job] = summary.durations.get(job, 0.0) + event["duration_s"]  # its attempts together
        if kind in (Event.DONE, Event.SKIPPED):
            summary.states[job] = "done"
            if kind == Event.SKIPPED:
                summary.reasons[job] = "skipped: DONE_IF already true"
        elif kind in (Event.FAILED, Event.INVALID):
            summary.states[job] = "failed"
            summary.reasons[job] = (event.get("why") or event.get("reason") or f"rc {event.get('rc')}")[:120]
        if kind in _SHOWN:
            echo(terminal_safe(_event_line(event)))  # a job's last line is its own output
    return offset + cut


def _read_status(root: Path) -> dict[str, Any] | None:
    try:
        return fresh_status(root, json.loads((root / "status.json").read_text()), every=True)  # each waiting job
    except (OSError, ValueError):
        return None
