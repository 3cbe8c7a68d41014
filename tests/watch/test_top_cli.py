"""`plan top --once` (one frame for scripts), plain frames when the output is not a terminal, usage errors, and
where its incidents come from and where their acks go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, wait_for, write_job
from tests.inprocess import plan_main

NOW = 1_000_000.0


def test_once_prints_one_frame_with_the_running_job_and_why_the_others_wait(
    tmp_path: Path, queue_root: Path, ticking: Any, stand_in: int
) -> None:
    write_job(queue_root, "1-cpu-a.job", "true\n")
    write_job(queue_root, "2-cpu-b.job", "true\n")
    write_job(queue_root, "3-gpu-c.job", f"# LANE=gpu\n# REQUIRES=test -f {tmp_path / 'never'}\ntrue\n")
    ticking(pid=stand_in).tick(NOW).tick(NOW + 1)  # the second tick: b waits on the busy lane, not on order
    ran = plan_main("top", str(queue_root), "--once", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("plan top ") and lines[0].endswith("1 host")
    assert any(line.startswith("  cpu  1-cpu-a.job") for line in lines)
    assert any("lane-busy    1  2-cpu-b.job" in line for line in lines)
    assert any("requires     1  3-gpu-c.job" in line for line in lines)
    assert not any("q quit" in line for line in lines)  # no keys are read: no keys' line


def test_once_exits_3_when_no_host_answers_and_usage_errors_exit_2(
    tmp_path: Path, plan_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  gone: {ssh: nobody@127.0.0.1, root: /q, connect_timeout: 1, timeout: 3,\n")
    ran = plan_main("top", "--once", "--hosts", str(hosts), cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 2 and "hosts.yaml" in ran.stderr and "Traceback" not in ran.stderr
    hosts.write_text(
        "hosts:\n  gone: {ssh: nobody@127.0.0.1, root: /q, connect_timeout: 1, timeout: 3,"
        " ssh_options: [-p, '1', -o, 'ProxyCommand=false']}\n"
    )
    ran = plan_main("top", "--once", "--hosts", str(hosts), cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "gone  UNREACHABLE:" in ran.stdout
    # a root that does not exist was reached and could not be read: an error, as plan watch and plan status say
    monkeypatch.delenv("COLUMNS", raising=False)  # (xdist's workers have one)
    ran = plan_main("top", "--once", str(tmp_path / "nonexist"), cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "nonexist  ERROR: reached " in ran.stdout and "UNREACHABLE" not in ran.stdout
    # into a pipe, whole: the cause was cut at 80 columns
    assert "(the directory does not exist)" in ran.stdout, ran.stdout
    ran = plan_main("top", "--once", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 2 and "name a HOST, or give a hosts file" in ran.stderr
    hosts.write_text("hosts: {}\n")
    ran = plan_main("top", "--hosts", str(hosts), cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 2 and "names no host" in ran.stderr
    ran = plan_main("top", str(tmp_path), "--interval", "0", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 2 and "--interval must be more than 0" in ran.stderr


def test_not_a_terminal_prints_a_plain_frame_each_interval_until_interrupted(
    tmp_path: Path, queue_root: Path, ticking: Any, stand_in: int
) -> None:
    write_job(queue_root, "1-cpu-a.job", "true\n")
    run = ticking(pid=stand_in).tick(NOW)
    out = tmp_path / "out"
    with open(out, "wb") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plancompiler.cli", "top", str(queue_root), "--interval", "0.2"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            # Ctrl-C at a terminal: a suite started as a shell's background job has SIGINT ignored, and Python
            # keeps it so in a child (it timed out here then)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        wait_for(lambda: out.read_text().count("plan top ") >= 1 and "1-cpu-a.job" in out.read_text())
        run.procs.exit("1-cpu-a.job", 0)
        run.tick(NOW + 5)
        wait_for(lambda: "ended done      1-cpu-a.job" in out.read_text())  # a later frame shows it ended
        assert "\x1b" not in out.read_text()  # plain text: no cursor moves, no colours
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_incidents_come_from_the_boxs_book_and_the_watchers_and_each_ack_goes_where_its_incident_lives(
    tmp_path: Path, queue_root: Path, ticking: Any, stand_in: int
) -> None:
    from plancompiler.hosts import resolve
    from plancompiler.top.probes import HostProbe
    from plancompiler.watch import Incident, WatchState, host_subject

    write_job(queue_root, "1-cpu-a.job", "# WARN_AFTER=1\ntrue\n")
    run = ticking(pid=stand_in).tick(NOW).tick(NOW + 5)  # a job past its WARN_AFTER: the box's book opens it
    host = resolve(str(queue_root))
    book = tmp_path / "book.json"  # the watcher's: DEAD (the box's heartbeat is old by this clock) seen long ago
    dead = Incident("DEAD", host_subject(host), "seen by plan watch", "dead", opened=NOW - 3600, seen=NOW)
    WatchState(incidents={f"DEAD:{host_subject(host)}": dead}).save(book)
    probe = HostProbe(host, 1.0, book)
    probe.once()
    found = {i.kind: i for i in probe.current().incidents}
    assert found["DEAD"].opened == NOW - 3600 and not found["DEAD"].acked  # since when the watcher's book has it
    stall = found["STALL"]
    assert stall.subject.endswith("1-cpu-a.job") and stall.opened == NOW + 5  # as the box's book has it
    assert "1-cpu-a.job" in stall.detail and not stall.detail.startswith(str(queue_root))  # the box's own words
    # an ack of the box's incident goes to the box (its runner takes it at its next tick)
    acking = threading.Thread(target=lambda: said.append(probe.ack(f"STALL:{stall.subject}")))
    said: list[str] = []
    acking.start()
    control = queue_root / "control"
    wait_for(lambda: control.is_dir() and [p for p in control.iterdir() if not p.name.startswith(".")], 10)
    run.tick(NOW + 6)
    acking.join(20)
    assert said and said[0].startswith(f"acked {stall.subject}"), said
    box = json.loads((queue_root / "incidents.json").read_text())
    assert [i["acked"] is not None for i in box["open"] if i["id"] == stall.subject] == [True]
    # an ack of the watcher's incident goes to the watcher's book, where plan watch and plan ack read it
    assert probe.ack(f"DEAD:{host_subject(host)}").startswith("acked DEAD:")
    assert WatchState.load(book).incidents[f"DEAD:{host_subject(host)}"].acked
    assert all(i.acked for i in probe.current().incidents)
    assert probe.ack("STALL:gone") == f"STALL:gone is no longer open on {queue_root}"
