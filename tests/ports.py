"""Loopback ports for the test daemons (sshd, slurmctld, slurmd, slurmdbd, mariadbd).

Not from bind(("127.0.0.1", 0)): that port comes from the kernel's ephemeral range, from which every outgoing
connection (each ssh, sbatch, squeue) takes its own, so a port found free there could be taken again before the
daemon bound it ("Address already in use": it happened about once in five suites with two clusters starting
at once). These come from below that range, from a block of this xdist worker's own, each checked by a bind.
"""

from __future__ import annotations

import os
import random
import socket
import threading

BASE, BLOCK = 20000, 1500  # 8 workers: 20000-31999, under Linux's default ephemeral range (32768-60999)
_lock = threading.Lock()
_next: list[int] = []


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = worker.removeprefix("gw")
    return int(digits) % 8 if digits.isdigit() else 0


def free_ports(count: int) -> list[int]:
    """COUNT ports of this worker's block that nothing listens on or holds now, none handed out before."""
    start = BASE + BLOCK * _worker_index()
    ports: list[int] = []
    with _lock:
        if not _next:
            # A run beside this one (another worktree's suite: the machine is shared) starts elsewhere in the
            # block: anywhere, not at pid % 97, whose few starts made two runs walk the same ports (slurmd lost
            # its port to another run's between the check and its bind)
            _next.append(start + random.SystemRandom().randrange(BLOCK))
        for _ in range(BLOCK):
            if len(ports) == count:
                break
            port = _next[0]
            _next[0] = start + (port + 1 - start) % BLOCK
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"no {count} free ports in {start}-{start + BLOCK - 1}")
    return ports
