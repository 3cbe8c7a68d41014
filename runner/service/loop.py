"""The runner's life in the foreground: tick, then wait for the next tick or for anything that should wake it
sooner (a child's exit, a job file or control request landing, a file settling), until SIGTERM/SIGINT.

The timer's tick, every --tick whatever woke the loop in between, is the sweep (every queued job judged); a
tick something else woke judges only what that can change (each lane's next candidates)."""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.service.runner import Runner

# Without inotify, queue/ and control/ are stat()ed this often while waiting: a new job file or a `plan
# retry` is then taken within about this long, whatever --tick is.
DIR_POLL_S = 0.05


def serve(runner: Runner) -> int:
    """Tick until SIGTERM/SIGINT; a child's exit wakes the loop at once."""
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    stop_signal: list[str] = []

    def on_stop(signum: int, _frame: object) -> None:
        stop_signal.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    runner.start(time.time())
    runner.watch_dirs()
    dirs = [str(runner.queue.dir("queue")), str(runner.queue.dir("control"))]
    sweep_at = time.monotonic()  # the next sweep: the first tick is one
    while not stop_signal:
        # Taken before the tick: a file that lands during the tick is seen at once afterwards
        # (the tick's own moves cost one extra tick, which then finds nothing to do).
        seen = [_mtime(d) for d in dirs] if runner.watch is None else []
        sweep = time.monotonic() >= sweep_at
        if sweep:
            sweep_at = time.monotonic() + runner.config.tick_s
        try:
            runner.tick(time.time(), sweep=sweep)
        except OSError as exc:
            # A disk full or a permission changed under us: say so and try again next tick, rather than
            # die and be restarted in a loop. status.json stops being rewritten, so `plan watch` sees DEAD.
            import traceback  # a failed tick is rare: not in every runner's start-up

            traceback.print_exc()
            print(f"runner: tick failed: {exc}", file=sys.stderr, flush=True)
        _wait(runner, rfd, dirs, seen, stop_signal, sweep_at)
    runner.stop(time.time(), stop_signal[0])
    return 0


def _wait(runner: Runner, rfd: int, dirs: list[str], seen: list[int], stop_signal: list[str], sweep_at: float) -> None:
    """Until the next sweep (SWEEP_AT, on the monotonic clock); at once for a child's exit, and for a new file in
    queue/ or control/: the moment it lands where inotify watches them, else within DIR_POLL_S (one stat of each
    directory)."""
    wait = max(sweep_at - time.monotonic(), 0.0)
    if runner.scanner.settle_due is not None:  # a file being written is taken the moment it has settled
        wait = min(wait, max(runner.scanner.settle_due - time.time(), 0.0) + 0.01)
    next_tick = time.monotonic() + wait
    _drain(rfd)
    fds = [rfd] + ([runner.watch.fd] if runner.watch is not None else [])
    while not stop_signal and not runner.processes.child_waiting():
        left = next_tick - time.monotonic()
        if left <= 0:
            return
        ready = select.select(fds, [], [], left if runner.watch is not None else min(left, DIR_POLL_S))[0]
        if runner.watch is not None and runner.watch.fd in ready:
            wake, created = runner.watch.read()
            # A start that failed (a full disk) put its file back: that move waits for the tick, or the
            # runner would spin retrying it.
            if wake and time.time() - runner.jobs.start_failed_at >= runner.config.tick_s:
                return  # a file is complete (or gone): the tick reads what changed
            if created:  # being written, or a link or FIFO that will never be closed: look in a moment
                next_tick = min(next_tick, time.monotonic() + DIR_POLL_S)
        if ready:
            _drain(rfd)
            continue
        if runner.watch is None and [_mtime(d) for d in dirs] != seen:
            return


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass
