"""Hosts: a name from the hosts file, a local path, or DEST:PATH; every remote call bounded and classified."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from plancompiler import agent
from plancompiler.diagnostics import PlanError
from plancompiler.tools import run_command

SSH_UNREACHABLE = 255


class Unreachable(Exception):
    """The host could not be reached (ssh exit 255 or the overall timeout): exit 3."""


class RemoteFailed(Exception):
    """The host was reached but the command there failed."""


@dataclass(frozen=True)
class Host:
    name: str
    root: str
    ssh: str | None = None  # destination; None for a local queue
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    timeout: float = 60.0
    python: str = "python3"
    backend: str = "queue"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.ssh is None

    def describe(self) -> str:
        if self.local:
            return self.root if self.name == self.root else f"{self.name} ({self.root})"
        return f"{self.name} ({self.ssh}:{self.root})"

    def ssh_argv(self) -> list[str]:
        assert self.ssh is not None
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.connect_timeout)}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2", *self.ssh_options, self.ssh]

    def call(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Run the agent in MODE on this host's queue: one round trip, JSON in and out."""
        source = Path(agent.__file__).read_text()
        if self.backend == "slurm":
            from plancompiler import slurm_agent

            # The Slurm handlers go first; agent.py's helpers and main() follow and run them.
            source = Path(slurm_agent.__file__).read_text().replace("from __future__ import annotations\n", "") \
                + "\n" + source.replace("from __future__ import annotations\n", "")
            mode = {"status": "slurm-status", "push": "slurm-push", "history": "slurm-history"}.get(mode, mode)
            request = {**request, "slurm_conf": self.extra.get("slurm_conf")}
        payload = json.dumps(request)
        limit = timeout or self.timeout
        if self.local:
            argv = [sys.executable, "-c", source, mode, self.root]
        else:
            remote = " ".join(shlex.quote(a) for a in [self.python, "-c", source, mode, self.root])
            argv = [*self.ssh_argv(), remote]
        started = time.monotonic()
        rc, out, err = run_command(argv, timeout=limit, stdin=payload)
        if rc == 124 and time.monotonic() - started >= limit - 0.5:
            raise Unreachable(f"{self.describe()}: no answer within {limit:g}s")
        if not self.local and rc == SSH_UNREACHABLE:
            last = err.strip().splitlines()[-1] if err.strip() else "exit 255"
            raise Unreachable(f"{self.describe()}: ssh could not connect: {last}")
        if rc != 0:
            raise RemoteFailed(f"{self.describe()}: the command on the host failed (exit {rc}): {err.strip()[-400:]}")
        try:
            result = json.loads(out)
        except ValueError as exc:
            raise RemoteFailed(f"{self.describe()}: the host's answer is not JSON: {out[:200]!r}") from exc
        if "controller_down" in result:
            raise Unreachable(f"{self.describe()}: the Slurm controller did not answer: {result['controller_down']}")
        return result


def hosts_file(explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    env = os.environ.get("PLAN_HOSTS")
    if env:
        return Path(env)
    default = Path("plans/hosts.yaml")
    return default if default.exists() else None


def resolve(spec: str, hosts: Path | None = None) -> Host:
    """HOST as a hosts-file name, a local path (./q, /srv/jobs, ~/jobs), or DEST:PATH for ssh."""
    path = hosts_file(hosts)
    if path is not None and path.exists() and not spec.startswith(("/", ".", "~")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise PlanError(f"{path}: not valid YAML: {exc}") from exc
        table = data.get("hosts", data) if isinstance(data, dict) else {}
        if spec in table:
            entry = table[spec] or {}
            if not isinstance(entry, dict) or "root" not in entry:
                raise PlanError(f"{path}: host {spec!r} needs at least `root:` (and `ssh:` for a remote host)")
            known = {"root", "ssh", "ssh_options", "connect_timeout", "timeout", "python", "backend"}
            return Host(name=spec, root=str(entry["root"]), ssh=entry.get("ssh"),
                        ssh_options=tuple(str(o) for o in entry.get("ssh_options", [])),
                        connect_timeout=float(entry.get("connect_timeout", 10)),
                        timeout=float(entry.get("timeout", 60)), python=str(entry.get("python", "python3")),
                        backend=str(entry.get("backend", "queue")),
                        extra={k: v for k, v in entry.items() if k not in known})
    if spec.startswith(("/", ".", "~")) or (os.sep in spec and ":" not in spec.split(os.sep, 1)[0]):
        return Host(name=spec, root=str(Path(os.path.expanduser(spec)).resolve()))
    dest, sep, root = spec.partition(":")
    if sep and dest and root:
        return Host(name=dest, root=root, ssh=dest)
    where = f" in {path}" if path else " (no hosts file: use --hosts, $PLAN_HOSTS or plans/hosts.yaml)"
    raise PlanError(f"unknown host {spec!r}{where}; give a name from the hosts file, a path, or DEST:PATH")
