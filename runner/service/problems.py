"""What is wrong with the runner's own files: a bad field said once (`state-corrupt`), a file that cannot be
written kept in memory, named in status.json and retried every tick rather than stopping the runner."""

from __future__ import annotations

from collections.abc import Callable

from runner.queue import Queue
from runner.vocab import Event

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.state import Problem


class FileProblems:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.said: dict[str, set[Problem]] = {}  # state-corrupt problems already reported, per file
        self.write_errors: dict[str, str] = {}  # file -> why the runner cannot keep it now

    def report(self, now: float, name: str, problems: list[Problem]) -> None:
        """One state-corrupt event per wrong field of NAME, not repeated while that file stays the same."""
        if not problems:
            # Called for every stamp of every queued job each tick: a sound file keeps no entry.
            self.said.pop(name, None)
            return
        said = self.said.setdefault(name, set())
        for field, why in problems:
            if (field, why) not in said:
                said.add((field, why))
                self.queue.emit(now, "-", Event.STATE_CORRUPT.value, file=name, field=field, why=why)

    def keep(self, now: float, name: str, write: Callable[[], None]) -> None:
        """Write one of the runner's files; one that cannot be written (disk full, permissions) is said once,
        kept in memory, named in status.json and retried every tick, rather than stopping the runner."""
        try:
            write()
        except OSError as exc:
            why = f"cannot write {name}: {exc.strerror or exc}; kept in memory, retried every tick"
            if name not in self.write_errors:
                self.queue.emit(now, "-", Event.STATE_CORRUPT.value, file=name, field="(write)", why=why)
            self.write_errors[name] = why
            return
        self.write_errors.pop(name, None)
