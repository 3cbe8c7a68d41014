"""`plan watch` on the Slurm backend: a controller that does not answer while the submit host does is DEAD."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.slurm import Slurm

cli = CliRunner()


@pytest.fixture(autouse=True)
def _no_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLAN_HOSTS", raising=False)


def test_stopped_controller_is_dead_on_the_first_probe_then_recovers(tmp_path: Path, slurm: Slurm) -> None:
    root = tmp_path / "submit"
    root.mkdir()
    hosts, state = slurm.hosts_file(root), tmp_path / "w.json"

    def watch() -> tuple[int, str]:
        result = cli.invoke(
            app,
            [
                "watch",
                "cluster",
                "--hosts",
                str(hosts),
                "--once",
                "--state",
                str(state),
                "--idle",
                "3600",
                "--probe-timeout",
                "60",
            ],
        )
        return result.exit_code, result.stdout

    watch()  # the cluster is shared by the session's tests: what their jobs raise opens here, once
    os.kill(slurm.pids["slurmctld"], signal.SIGSTOP)
    try:
        code, out = watch()
    finally:
        os.kill(slurm.pids["slurmctld"], signal.SIGCONT)
    assert code == 14, out
    assert out.startswith("DEAD: cluster: the submit host answers but its Slurm controller does not: ")
    code, out = watch()
    assert code == 0 and out.startswith("RECOVERED: DEAD cluster recovered after "), out
