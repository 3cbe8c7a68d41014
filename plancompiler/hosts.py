"""Hosts: a name from the hosts file, a local path, or DEST:PATH; every call to one bounded and classified."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plancompiler import localagent, sshsession, transport
from plancompiler.diagnostics import PlanError
from plancompiler.transport import RemoteFailed, Unreachable

if TYPE_CHECKING:  # the hosts model is pydantic: imported only where a hosts file is read
    from plancompiler.hostsfile import HostEntry, SlurmHostEntry

AgentSession = localagent.LocalSession | sshsession.Session

__all__ = ["AgentSession", "Host", "RemoteFailed", "Unreachable", "hosts_file", "resolve"]


@dataclass(frozen=True)
class Host:
    name: str
    root: str
    ssh: str | None = None  # destination; None for a local queue
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    timeout: float = 60.0
    python: str = "python3"
    max_answer_bytes: int = 16 << 20  # an answer from the host past this is cut off, never read whole
    backend: str = "queue"
    slurm: SlurmHostEntry | None = None  # the Slurm settings of a `backend: slurm` host
    slots: tuple[tuple[str, int], ...] = ()  # lane -> slots from a queue host's `lanes:` (pushed to its manifest)
    gpus: tuple[int, ...] = ()  # a queue host's `gpus:`: the GPUs its gpu lane gives its jobs (pushed to its manifest)

    @classmethod
    def from_entry(cls, name: str, entry: HostEntry) -> Host:
        from plancompiler.hostsfile import QueueHostEntry, SlurmHostEntry

        return cls(
            name=name,
            root=entry.root,
            ssh=entry.ssh,
            ssh_options=tuple(entry.ssh_options),
            connect_timeout=entry.connect_timeout,
            timeout=entry.timeout,
            python=entry.python,
            max_answer_bytes=int(entry.max_answer_mb * (1 << 20)),
            backend=entry.backend,
            slurm=entry if isinstance(entry, SlurmHostEntry) else None,
            slots=tuple((lane, spec.slots) for lane, spec in entry.lanes.items())
            if isinstance(entry, QueueHostEntry)
            else (),
            gpus=tuple(entry.gpus or ()) if isinstance(entry, QueueHostEntry) else (),
        )

    @property
    def local(self) -> bool:
        return self.ssh is None

    def describe(self) -> str:
        if self.local:
            return self.root if self.name == self.root else f"{self.name} ({self.root})"
        return f"{self.name} ({self.ssh}:{self.root})"

    def endpoint(self) -> transport.Endpoint:
        return transport.Endpoint(
            self.describe(),
            self.root,
            self.ssh,
            self.ssh_options,
            self.connect_timeout,
            self.timeout,
            self.python,
            self.max_answer_bytes,
        )

    def context(self) -> dict[str, Any]:
        """What every request to this host carries: the backend whose handlers answer it, and its settings."""
        if self.slurm is not None:
            return {"backend": "slurm", "slurm_conf": self.slurm.slurm_conf}
        return {"backend": self.backend}

    def call(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Run the agent in MODE on this host's root: one round trip, JSON in and out."""
        request = {**self.context(), **request}
        if self.local:
            return localagent.call(self.endpoint(), mode, request, timeout)
        return transport.call(self.endpoint(), mode, request, timeout)

    def session(self, timeout: float | None = None) -> AgentSession:
        """An agent that answers several requests and keeps what it locked until closed: in this process for a
        local root, else a process on the host."""
        if self.local:
            return localagent.LocalSession(self.endpoint(), timeout)
        return sshsession.Session(self.endpoint(), timeout)


def hosts_file(explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    env = os.environ.get("PLAN_HOSTS")
    if env:
        return Path(env)
    default = Path("plans/hosts.yaml")
    return default if default.exists() else None


def _is_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or (os.sep in spec and ":" not in spec.split(os.sep, 1)[0])


def resolve(spec: str, hosts: Path | None = None) -> Host:
    """HOST as a hosts-file name, a local path (./q, /srv/jobs, ~/jobs), or DEST:PATH for ssh."""
    path = hosts_file(hosts)
    table: dict[str, HostEntry] = {}
    if path is not None and not _is_path(spec):
        if not os.path.lexists(path):  # never raises: a name too long is not found either
            raise PlanError(f"hosts file {path} not found")
        from plancompiler.hostsfile import load_hosts  # pydantic: only where a hosts file is read

        table = load_hosts(path)
        if spec in table:
            return Host.from_entry(spec, table[spec])
    if _is_path(spec):
        return Host(name=spec, root=str(Path(os.path.realpath(os.path.expanduser(spec)))))
    dest, sep, root = spec.partition(":")
    if sep and dest and root:
        return Host(name=dest, root=root, ssh=dest)
    hint = difflib.get_close_matches(spec, table, n=1)
    if hint:
        raise PlanError(f"unknown host {spec!r} in {path}; did you mean {hint[0]!r}?")
    if os.path.isdir(spec):  # a queue here, named as a host would be: a path says ./ (or /)
        raise PlanError(f"unknown host {spec!r}; for the directory {spec} here, give it as a path: ./{spec}")
    where = f" in {path}" if path else " (no hosts file: use --hosts, $PLAN_HOSTS or plans/hosts.yaml)"
    raise PlanError(f"unknown host {spec!r}{where}; give a name from the hosts file, a path, or DEST:PATH")
