"""The backends a host can have: a stdlib runner's queue, or a Slurm cluster; both behind one protocol."""

from __future__ import annotations

from plancompiler.backends.protocol import Backend
from plancompiler.backends.queue import QueueBackend
from plancompiler.backends.queue import plan_record as plan_record  # `plan add`'s manifest entry
from plancompiler.hosts import Host


def backend_for(host: Host) -> Backend:
    """The backend that serves HOST, as its hosts-file entry says (a path or DEST:PATH is a queue)."""
    if host.slurm is not None:
        from plancompiler.backends.slurm import SlurmBackend  # pydantic's hosts model: only for Slurm hosts

        return SlurmBackend(host)
    return QueueBackend(host)
