"""A watcher's memory between probes: its rules, and its state file per queue (offset, counters, open incidents)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plancompiler.errors import PlanError
from plancompiler.hosts import Host
from plancompiler.watch.args import DEFAULT_EVENTS
from plancompiler.watch.incidents import Incident, ack, dump_incidents, load_incidents
from runner.files import atomic_write, not_replaceable, read_json


@dataclass(frozen=True)
class Rules:
    events: tuple[str, ...] = DEFAULT_EVENTS
    net_stall_s: float = 3600.0
    idle_s: float = 600.0
    dead_s: float = 300.0
    unreachable_n: int = 5
    parked_repeat_s: float = 7200.0
    waiting_s: float = 1800.0
    waiting_by_reason: dict[str, float] = field(default_factory=dict)

    def waiting_limit(self, reason: str) -> float:
        return self.waiting_by_reason.get(reason, self.waiting_s)


@dataclass
class WatchState:
    """Kept per host between probes and restarts: the event offset, counters and the open incidents."""

    offset: int = -1
    head: str = ""  # fingerprint of the events file's first bytes: a rotated file has another
    failures: int = 0
    idle_since: float | None = None
    # "job\treason\tblocker" -> when this watcher first saw it (Slurm's squeue has no such time)
    waiting_seen: dict[str, float] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    heartbeat_sent: float | None = None
    probed: float | None = None
    probed_ok: float | None = None  # the last probe the host answered (a gap since then is said as a digest)

    @classmethod
    def load(cls, path: Path) -> WatchState:
        try:
            data = read_json(path)  # a regular file only, never blocking: a FIFO as --state is no state
            values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            values["incidents"] = load_incidents(values.get("incidents"))
            return cls(**values)
        except (OSError, ValueError, TypeError, AttributeError):
            return cls()

    def save(self, path: Path) -> None:
        check_state_file(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self) | {"incidents": dump_incidents(self.incidents)}
        atomic_write(path, json.dumps(data).encode())


def check_state_file(path: Path) -> None:
    """PlanError (exit 2) where PATH is there but is not a regular file: a FIFO or a device reads as no state
    (`load`), but the first save would replace it."""
    problem = not_replaceable(path)
    if problem:
        raise PlanError(f"--state {problem}")


def state_path(host: Host) -> Path:
    """The watcher's state file for HOST's queue: keyed by where the queue is (a local root by its resolved
    path, a remote one by destination and root), not by how the command line spelt it, so `plan ack` given
    ./q, /abs/q or a hosts-file name finds the incidents `plan watch` opened under another spelling."""
    base = Path(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")) / "plancompiler"
    root = os.path.realpath(os.path.expanduser(host.root)) if host.local else host.root
    label = os.path.basename(root.rstrip("/")) if host.local else str(host.ssh)
    ident = hashlib.sha1(f"{host.ssh}:{root}".encode(errors="surrogateescape")).hexdigest()[:12]
    path = base / f"watch-{label.replace('/', '_')[-40:] or 'root'}-{ident}.json"
    legacy = (
        base / f"watch-{host.name.replace('/', '_')[-40:]}-"
        f"{hashlib.sha1(f'{host.ssh}:{host.root}'.encode(errors='surrogateescape')).hexdigest()[:12]}.json"
    )
    if legacy != path and legacy.exists() and not path.exists():
        try:  # a state file named the old way (by the spelling): carried over once, its incidents kept
            legacy.rename(path)
        except OSError:
            return legacy
    return path


def host_subject(host: Host) -> str:
    """What a host's incidents are about: a local queue by its resolved root (however it was spelt), else the
    host's name."""
    if host.local and host.backend == "queue":
        return os.path.realpath(os.path.expanduser(host.root))
    return host.name


def acknowledge(path: Path, spec: str, until: float | None, now: float) -> Incident:
    """`plan ack`: the one open incident SPEC (KIND[:SUBJECT]) names in the state file PATH, silenced until
    UNTIL (None: until it changes or recovers) and saved; AckError where none or several match."""
    book = WatchState.load(path)
    found = ack(book.incidents, spec, until, now)
    book.save(path)
    return found
