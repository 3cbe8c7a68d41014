"""The workstation trusts no box: a host that streams without end, drips bytes past the deadline or answers
with terminal escapes is cut off, timed out and shown cleaned (a fake `python3` on the test sshd's side)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, plan_cli
from tests.sshd import Sshd

ESC = "\x1b"
OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # writes "pwned" to the terminal's clipboard
TITLE = "\x1b]0;owned\x07"


def fake_host(sshd: Sshd, tmp_path: Path, script: str, **settings: object) -> Path:
    """A hosts file whose box runs SCRIPT (sh) where the workstation runs python3 -S -c LOADER ..."""
    fake = tmp_path / "fake-python3"
    fake.write_text("#!/bin/sh\n" + script + "\n")
    fake.chmod(0o755)
    root = tmp_path / "box"
    root.mkdir(mode=0o700, exist_ok=True)
    lines = [
        f"hosts:\n  testbox:\n    ssh: testbox\n    root: {root}\n    python: {fake}\n",
        f"    ssh_options: [-F, {sshd.config}]\n",
        *(f"    {k}: {v}\n" for k, v in settings.items()),
    ]
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("".join(lines))
    return hosts


def plan_process(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """`plan ARGS` as a real process: (its result, seconds it took, its peak RSS in KiB)."""
    code = (
        "import resource, subprocess, sys, time\n"
        "t = time.monotonic()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "took = time.monotonic() - t\n"
        "sys.stdout.write(p.stdout)\nsys.stderr.write(p.stderr)\n"
        "print(took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(p.returncode)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-m", "plancompiler.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    *rest, last = proc.stderr.rstrip("\n").split("\n")
    took, rss = last.split()
    proc.stderr = "\n".join(rest)
    return proc, float(took), int(rss)


def test_a_host_that_streams_without_end_is_cut_off_with_memory_bounded(sshd: Sshd, tmp_path: Path) -> None:
    hosts = fake_host(sshd, tmp_path, "exec yes garbage", max_answer_mb=2, timeout=20)
    proc, took, rss_kib = plan_process("status", "testbox", "--hosts", str(hosts))
    assert proc.returncode == 1, proc.stderr
    assert f"the host's answer passed {2 << 20} bytes and was cut off" in proc.stderr
    assert took < 15, "cut off at the cap, not at the deadline"
    assert rss_kib < 200 * 1024, f"peak RSS {rss_kib} KiB"


@pytest.mark.parametrize(
    ("script", "said"),
    [
        # a push talks to one agent session, line by line: a line without end is cut off too
        ("cat /dev/zero", "the host's answer passed"),
        # stderr without end: cut off once past the cap (kept as its last 4 KiB, in memory, never in a file)
        ("exec yes noise >&2", "the host's error output passed"),
    ],
    ids=["stdout-without-newline", "stderr-flood"],
)
def test_a_push_session_that_streams_without_end_is_cut_off_at_the_cap(
    sshd: Sshd, tmp_path: Path, script: str, said: str
) -> None:
    """A push's agent session that streams without end, on stdout without a newline or on stderr: cut off once
    it passed the cap, not at the deadline, with memory and disk bounded."""
    hosts = fake_host(sshd, tmp_path, script, max_answer_mb=1, timeout=20)
    plan = tmp_path / "p.yaml"
    plan.write_text(f"plan: p\njobs:\n  - name: a\n    run: touch {tmp_path}/a\n    outputs: [{tmp_path}/a]\n")
    proc, took, rss_kib = plan_process("push", "testbox", str(plan), "--hosts", str(hosts))
    assert proc.returncode == 1 and f"{said} {1 << 20} bytes and was cut off" in proc.stderr, proc.stderr
    assert took < 15 and rss_kib < 200 * 1024


def test_the_deadline_holds_while_bytes_keep_coming(sshd: Sshd, tmp_path: Path) -> None:
    hosts = fake_host(sshd, tmp_path, "while :; do printf x; sleep 0.05; done")
    started = time.monotonic()
    code, output = plan_cli("status", "testbox", "--hosts", str(hosts), "--timeout", "2")
    assert code == 3 and "no answer within 2s" in output, output
    assert time.monotonic() - started < 8


@pytest.mark.parametrize(
    "script",
    [
        # stderr of a command that failed there
        f"printf '{OSC52}{TITLE}oops\\n' >&2; exit 1",
        # an agent error
        "printf '%s' " + repr(json.dumps({"error": f"{OSC52}denied{TITLE}"})),
    ],
)
def test_terminal_escapes_from_a_host_never_reach_the_terminal(sshd: Sshd, tmp_path: Path, script: str) -> None:
    hosts = fake_host(sshd, tmp_path, script)
    code, output = plan_cli("status", "testbox", "--hosts", str(hosts))
    assert code == 1, output
    assert ESC not in output and "\x07" not in output and ("oops" in output or "denied" in output), repr(output)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"status": None, "events": []}, "the agent's status answer has no integer 'offset'"),
        ({"offset": "7", "events": []}, "the agent's status answer has no integer 'offset'"),
        ({"offset": 0, "head": 5, "events": []}, "the agent's status answer's 'head' is not a string"),
        ([1, 2], "the host's answer is not a JSON object: '[1, 2]'"),
    ],
)
def test_a_status_answer_of_the_wrong_shape_is_one_watch_error_never_a_crash(
    sshd: Sshd, tmp_path: Path, plan_env: None, answer: object, said: str
) -> None:
    """The watcher took any JSON object for a status answer: one without an integer 'offset' ended it with a
    KeyError (and no line said why). Now it is the probe's ERROR, naming the host and what is wrong."""
    hosts = fake_host(sshd, tmp_path, "cat >/dev/null; printf '%s' " + repr(json.dumps(answer)))
    code, output = plan_cli("watch", "testbox", "--hosts", str(hosts), "--once", "--state", str(tmp_path / "w"))
    assert code == 16 and "Traceback" not in output, output
    assert output.startswith("ERROR: ") and "testbox" in output and said in output, output


def test_a_park_reason_with_escapes_is_shown_cleaned(tmp_path: Path, plan_env: None) -> None:
    root = tmp_path / "q"
    root.mkdir(mode=0o700)
    (root / "parked.json").write_text(json.dumps({"reason": f"BIOS{OSC52}\u202eupdate", "by": "x", "since": "now"}))
    plan = tmp_path / "p.yaml"
    plan.write_text(f"plan: p\njobs:\n  - name: a\n    run: touch {tmp_path}/a\n    outputs: [{tmp_path}/a]\n")
    code, output = plan_cli("push", str(root), str(plan), "--dry-run")
    assert code == 0, output
    assert "BIOS" in output and ESC not in output and "\u202e" not in output, repr(output)


def test_retry_and_cancel_refuse_a_job_name_no_file_can_have(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    for command in ("retry", "cancel", "logs"):
        started = time.monotonic()
        code, output = plan_cli(command, str(root), "a\nb")
        assert code == 2 and "bad job name" in output, (command, output)
        assert time.monotonic() - started < 5, "refused at once, not after the control wait"
    assert not (root / "control").exists() or not os.listdir(root / "control")


def test_watch_state_that_is_a_fifo_is_no_state_and_never_blocks(tmp_path: Path) -> None:
    """`plan watch --state FIFO` waited forever for a writer; now the FIFO reads as no state (a first probe)."""
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    code = (
        "from pathlib import Path\nfrom plancompiler.watch.state import WatchState\n"
        f"print(WatchState.load(Path({str(fifo)!r})).offset)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert done.returncode == 0 and done.stdout.strip() == "-1", done.stderr
