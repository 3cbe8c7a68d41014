"""Bounded on the box too: an agent whose client gave up ends itself at the host's timeout, and `plan status`
waits no longer than the hosts file's `timeout:`. Real ssh to the loopback sshd."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.conftest import runner_lock_held, wait_for
from tests.inprocess import plan_main
from tests.sshd import Sshd


def _agents(root: Path) -> list[int]:
    """Processes on this machine running an agent on ROOT (the loader's command line names the root)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue
        if b"-c" in words and str(root).encode() in words and b"ack" in words:
            found.append(int(pid))
    return found


def test_a_hung_agent_leaves_no_process_behind(tmp_path: Path, queue_root: Path, sshd: Sshd) -> None:
    hosts = sshd.hosts_file(queue_root, connect_timeout=2, timeout=3)
    incident = {"id": "gpu-held:pid 7", "kind": "gpu-held", "subject": "pid 7", "text": "held", "jobs": []}
    incident |= {"count": 0, "look": "", "opened": 1.0, "seen": 1.0}
    (queue_root / "incidents.json").write_text(json.dumps({"version": 1, "open": [incident]}))
    # A runner that holds the root's lock but never takes the ack (hung): the agent would wait the 60 s asked
    # for; the call's limit is the host's 3 s. (With no runner at all the agent answers at once.)
    started = time.monotonic()
    with runner_lock_held(queue_root):
        ran = plan_main(
            "ack", "testbox", "gpu-held", "--wait", "60", "--hosts", str(hosts), cwd=tmp_path, cache=tmp_path
        )
        assert ran.returncode == 3 and "no answer within 3s" in ran.stderr
        wait_for(lambda: _agents(queue_root), 5)  # the agent outlived its client ...
        wait_for(lambda: not _agents(queue_root), 15)  # ... and ended itself at the host's timeout
        assert time.monotonic() - started < 15


def test_plan_status_honours_the_hosts_file_timeout(tmp_path: Path, queue_root: Path, sshd: Sshd) -> None:
    hosts = sshd.hosts_file(queue_root, connect_timeout=2, timeout=3)
    os.kill(sshd.proc.pid, signal.SIGSTOP)  # the box answers no more
    try:
        started = time.monotonic()
        ran = plan_main("status", "testbox", "--hosts", str(hosts), cwd=tmp_path, cache=tmp_path)
        took = time.monotonic() - started
    finally:
        os.kill(sshd.proc.pid, signal.SIGCONT)
    assert ran.returncode == 3 and "unreachable" in ran.stderr and took < 10, (took, ran.stderr)


def test_plan_status_waits_the_hosts_file_timeout_unless_timeout_is_given(
    tmp_path: Path, queue_root: Path, sshd: Sshd
) -> None:
    """Issue 28: --timeout once defaulted to 60 s over the hosts file's `timeout:`; now that wins unless given."""
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 6\n")  # a box whose python connects, then answers nothing
    slow.chmod(0o755)
    hosts = sshd.hosts_file(queue_root, name="slowbox", timeout=1)
    hosts.write_text(hosts.read_text().replace(f"python: {sys.executable}", f"python: {slow}"))
    for extra, limit in (((), "1s"), (("--timeout", "2"), "2s")):
        started = time.monotonic()
        ran = plan_main("status", "slowbox", "--hosts", str(hosts), *extra, cwd=tmp_path, cache=tmp_path)
        took = time.monotonic() - started
        assert ran.returncode == 3 and f"no answer within {limit}" in ran.stderr, (extra, ran.stderr)
        assert took < 8, (extra, took)
