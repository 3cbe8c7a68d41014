"""`plan top` in a real terminal: tmux runs it against a local root and a root over the test sshd, each served by a
real runner, and the test reads the screen with capture-pane."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, RunnerProcess, wait_for, write_job
from tests.sshd import IN_CI, Sshd

_HOLD = 'while [ ! -e "{flag}" ]; do sleep 0.1; done\n'


@pytest.fixture
def tmux(tmp_path: Path):
    if shutil.which("tmux") is None:
        if IN_CI:
            pytest.fail("tmux missing in CI: .ci/run must install it")
        pytest.skip("tmux not installed")
    socket = tmp_path / "tmux.sock"
    yield ["tmux", "-S", str(socket)]
    subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)


def _screen(tmux: list[str]) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True).stdout


def _shows(tmux: list[str], *texts: str, timeout: float = 15.0) -> str:
    def found() -> str | None:
        screen = _screen(tmux)
        return screen if all(t in screen for t in texts) else None

    try:
        return wait_for(found, timeout, 0.1)  # type: ignore[return-value]
    except AssertionError:
        raise AssertionError(f"the screen never showed {texts}:\n{_screen(tmux)}") from None


def test_plan_top_in_tmux_shows_two_hosts_refreshes_marks_an_unreachable_one_and_acks(
    tmp_path: Path, tmux: list[str], sshd: Sshd
) -> None:
    local, remote = tmp_path / "local" / "q", tmp_path / "remote" / "q"
    flag = tmp_path / "release"
    # local: one job running past its WARN_AFTER (a STALL incident), one behind it, one on a file never made
    write_job(local, "10-cpu-long.job", "# LANE=cpu\n# WARN_AFTER=1\necho PROGRESS: 1/4\n" + _HOLD.format(flag=flag))
    write_job(local, "20-cpu-next.job", "# LANE=cpu\n" + _HOLD.format(flag=flag))
    write_job(local, "30-cpu-gate.job", f"# LANE=cpu\n# REQUIRES=test -f {tmp_path / 'never'}\ntrue\n")
    write_job(remote, "10-gpu-remote.job", "# LANE=gpu\n" + _HOLD.format(flag=flag))
    runners = [RunnerProcess(local).start(), RunnerProcess(remote).start()]
    try:
        hosts = sshd.hosts_file(remote, connect_timeout=2, timeout=4)
        state = tmp_path / "state"
        env = {"PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state), "TERM": "xterm-256color"}
        command = [sys.executable, "-m", "plancompiler.cli", "top", str(local), "testbox"]
        command += ["--hosts", str(hosts), "--interval", "1"]
        subprocess.run(
            [
                *tmux,
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "80",
                "-y",
                "24",
                "env",
                *(f"{k}={v}" for k, v in env.items()),
                *command,
            ],
            check=True,
        )
        # both hosts' running jobs, and why the others wait
        screen = _shows(tmux, "10-cpu-long.job", "10-gpu-remote.job", "lane-busy", "requires", "testbox")
        assert "20-cpu-next.job" in screen and "30-cpu-gate.job" in screen
        assert all(len(line) <= 80 for line in screen.splitlines()) and len(screen.splitlines()) <= 24
        # a key acks the incident (the first row, selected): on screen, and on the box, whose runner judged it
        _shows(tmux, "! STALL long-running:10-cpu-long.job")
        subprocess.run([*tmux, "send-keys", "-t", "top", "a"], check=True)
        _shows(tmux, "(acked)", "acked long-running:10-cpu-long.job")
        book = json.loads((local / "incidents.json").read_text())
        assert [i["acked"] is not None for i in book["open"] if i["id"] == "long-running:10-cpu-long.job"] == [True]
        # it refreshes by itself: the long job ends, the next one runs
        flag.write_text("")
        write_job(local, "40-cpu-late.job", "# LANE=cpu\n" + _HOLD.format(flag=tmp_path / "later"))
        _shows(tmux, "ended done      10-cpu-long.job")
        # the ssh host stops answering: marked within one interval (and its timeout), the local one goes on
        os.kill(sshd.proc.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            screen = _shows(tmux, "testbox", "NO ANSWER", timeout=10)
            assert time.monotonic() - stopped < 6
            assert "40-cpu-late.job" in screen  # the other host is still drawn
        finally:
            os.kill(sshd.proc.pid, signal.SIGCONT)
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True)
        wait_for(lambda: "top" not in subprocess.run([*tmux, "ls"], capture_output=True, text=True).stdout, 10)
    finally:
        (tmp_path / "later").write_text("")
        for runner in runners:
            runner.stop()
