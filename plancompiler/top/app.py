"""`plan top`'s loop: probes in the background, the frame redrawn with rich.live, keys read in cbreak mode; one
plain frame for `--once`, plain frames at each interval when the output is not a terminal."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from plancompiler.hosts import Host
from plancompiler.top.frame import Frame, HostView, Item, Ui, build
from plancompiler.top.keys import Actions, handle, read_keys
from plancompiler.top.probes import HostProbe

# How often the screen is drawn (the probes keep their own interval): ages and "no answer for" stay current.
REDRAW_S = 0.25
LOG_LINES = 200
ACTION_WAIT_S = 15.0  # how long retry and cancel wait for the runner to take the request


def default_interval(host: Host) -> float:
    return 2.0 if host.local else 10.0


@dataclass(frozen=True)
class TopOptions:
    interval: float | None = None  # None: 2 s for a local root, 10 s over ssh
    once: bool = False


class Top:
    def __init__(self, hosts: list[Host], options: TopOptions, book: Callable[[Host], Path]) -> None:
        self.probes = [HostProbe(h, options.interval or default_interval(h), book(h)) for h in hosts]
        self.ui = Ui()
        self.busy = threading.Lock()  # one key action at a time

    def views(self) -> list[HostView]:
        return [p.current() for p in self.probes]

    def frame(self, width: int, height: int | None, keys: bool = True) -> Frame:
        return build(self.views(), self.ui, time.time(), width, height, keys)

    def once(self) -> None:
        """Every host probed once, at the same time; each bounded by its host's timeout."""
        threads = [threading.Thread(target=p.once, daemon=True) for p in self.probes]
        for thread in threads:
            thread.start()
        for thread, probe in zip(threads, self.probes, strict=True):
            thread.join(probe.host.timeout + 5)

    # -- what keys ask for, each in the background ---------------------------------------------
    def actions(self) -> Actions:
        return Actions(self._ack, self._log, self._retry, self._cancel)

    def _background(self, what: str, work: Callable[[], None]) -> None:
        if not self.busy.acquire(blocking=False):
            self.ui.message = "busy with the last key; try again in a moment"
            return
        self.ui.message = f"{what}..."

        def run() -> None:
            try:
                work()
            except Exception as exc:  # an unreachable host or a refused request: said, never a crash of the screen
                self.ui.message = f"{what}: {exc}"
            finally:
                self.busy.release()

        threading.Thread(target=run, daemon=True).start()

    def _ack(self, item: Item) -> None:
        probe = self.probes[item.host]

        def work() -> None:
            self.ui.message = probe.ack(item.key)
            probe.wake.set()

        self._background(f"ack {item.key}", work)

    def _log(self, item: Item) -> None:
        from plancompiler.commands import operate

        host = self.probes[item.host].host

        def work() -> None:
            parts: list[str] = []
            state = operate.logs(host, item.key, LOG_LINES, False, 1.0, parts.append)
            self.ui.log = (f"{host.name}: {item.key} ({state or 'gone'}): its last {LOG_LINES} lines", "".join(parts))
            self.ui.message = ""

        self._background(f"log of {item.key}", work)

    def _control(self, item: Item, action: str) -> None:
        from plancompiler.commands import operate

        probe = self.probes[item.host]

        def work() -> None:
            do = operate.retry if action == "retry" else operate.cancel
            self.ui.message = f"{probe.host.name}: {do(probe.host, item.key, ACTION_WAIT_S)}"
            probe.wake.set()

        self._background(f"{action} {item.key}", work)

    def _retry(self, item: Item) -> None:
        self._control(item, "retry")

    def _cancel(self, item: Item) -> None:
        self._control(item, "cancel")

    # -- the three ways to show it --------------------------------------------------------------
    def print_once(self, out: TextIO, width: int) -> int:
        self.once()
        out.write(self.frame(width, None, keys=False).plain() + "\n")
        out.flush()
        views = self.views()
        if any(v.answer is not None for v in views):
            return 0
        return 1 if any(v.failure.startswith("ERROR:") for v in views) else 3  # read, not reached: as plan status

    def plain(self, out: TextIO, width: int) -> int:
        """Not a terminal: a plain frame each interval, until interrupted."""
        for probe in self.probes:
            probe.start()
        every = min(p.interval for p in self.probes)
        try:
            while True:
                time.sleep(every)
                out.write(self.frame(width, None, keys=False).plain() + "\n\n")
                out.flush()
        except KeyboardInterrupt:
            return 0

    def live(self, out: TextIO) -> int:
        import termios
        import tty

        from rich.console import Console
        from rich.live import Live

        console = Console(file=out, highlight=False)
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        for probe in self.probes:
            probe.start()
        actions = self.actions()
        try:
            tty.setcbreak(fd)
            with Live(console=console, screen=True, auto_refresh=False) as live:
                while True:
                    frame = self.frame(console.width, console.height)
                    live.update(to_text(frame), refresh=True)
                    for key in read_keys(fd, REDRAW_S):
                        if handle(key, self.ui, frame, actions):
                            return 0
                        frame = self.frame(console.width, console.height)
        except KeyboardInterrupt:
            return 0
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def to_text(frame: Frame):  # -> rich.text.Text (rich is imported only where a screen is drawn)
    from rich.text import Text

    text = Text(no_wrap=True, overflow="crop")
    for n, line in enumerate(frame.lines):
        if n:
            text.append("\n")
        text.append(line.text, style=line.style or None)
    return text


def run_top(hosts: list[Host], options: TopOptions, book: Callable[[Host], Path], out: TextIO | None = None) -> int:
    """`plan top`: one frame (--once), plain frames (output not a terminal), or the live screen."""
    out = out or sys.stdout
    top = Top(hosts, options, book)
    # Lines are cut to a terminal's width; into a file or a pipe whole (an error's cause was cut at 80 columns),
    # unless COLUMNS asks for a width.
    terminal = out.isatty() or "COLUMNS" in os.environ
    width = shutil.get_terminal_size((100, 24)).columns if terminal else 1 << 16
    if options.once:
        return top.print_once(out, width)
    if not (out.isatty() and sys.stdin.isatty()):
        return top.plain(out, width)
    return top.live(out)
