"""`plan watch` on the Slurm backend: a controller that does not answer while the submit host does is DEAD."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("no_hosts")


@pytest.fixture
def slurm_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A cluster of this test's own: it stops the controller, which no other test's squeue should wait on; and its
    clients give up on a silent controller after 1 s, not Slurm's default 10 (the probe below waits that long)."""
    cluster = start_slurm(tmp_path_factory.mktemp("alone"), message_timeout=1)
    yield cluster
    stop_slurm(cluster)


def test_stopped_controller_is_dead_on_the_first_probe_then_recovers(tmp_path: Path, slurm_alone: Slurm) -> None:
    slurm = slurm_alone
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

    assert watch() == (0, "")  # the first probe: the controller answers, nothing to say
    os.kill(slurm.pids["slurmctld"], signal.SIGSTOP)
    try:
        code, out = watch()
    finally:
        os.kill(slurm.pids["slurmctld"], signal.SIGCONT)
    assert code == 14, out
    assert out.startswith("DEAD: cluster: the submit host answers but its Slurm controller does not: ")
    code, out = watch()
    assert code == 0 and out.startswith("RECOVERED: DEAD cluster recovered after "), out
