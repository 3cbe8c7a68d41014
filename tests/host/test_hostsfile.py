"""The hosts file is a strict model: a typo is a located error with a suggestion (exit 2), never a silent default."""

from __future__ import annotations

from pathlib import Path

import pytest

from plancompiler.backends.slurm import sbatch_args
from plancompiler.hosts import resolve
from plancompiler.hostsfile import load_hosts
from tests.conftest import REPO, plan_cli

pytestmark = pytest.mark.usefixtures("plan_env")


def hosts(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            "    root: /q\n    ssh: box\n    conect_timeout: 5\n",
            ":5:5: error[H001]: unknown key 'conect_timeout' in hosts.box; did you mean 'connect_timeout'?",
        ),
        (
            "    root: /q\n    backend: slurm\n    partiton: gpu\n",
            ":5:5: error[H001]: unknown key 'partiton' in hosts.box; did you mean 'partition'?",
        ),
        (
            '    root: /q\n    ssh: box\n    ssh_options: "-F cfg"\n',
            ":5:18: error[H001]: hosts.box.ssh_options: Input should be a valid list (write a YAML list",
        ),
        (
            "    root: /q\n    backend: slrum\n",
            ":4:14: error[H001]: hosts.box.backend: unknown backend 'slrum'; did you mean 'slurm'? (known: queue, slurm)",
        ),
        ("    ssh: box\n", ":3:5: error[H001]: hosts.box: missing required key 'root'"),
        (
            "    root: /q\n    backend: slurm\n    lanes:\n      gpu: {gress: 'gpu:1'}\n",
            ":6:13: error[H001]: unknown key 'gress' in hosts.box.lanes.gpu; did you mean 'gres'?",
        ),
        ("    root: /q\n    timeout: soon\n", ":4:14: error[H001]: hosts.box.timeout: Input should be a valid number"),
    ],
)
def test_a_typo_in_the_hosts_file_is_a_located_error(tmp_path: Path, entry: str, expected: str) -> None:
    path = hosts(tmp_path, "hosts:\n  box:\n" + entry)
    code, out = plan_cli("status", "box", "--hosts", str(path))
    assert code == 2
    assert f"plan: {path}{expected}" in out
    assert "Traceback" not in out and "unreachable" not in out


def test_every_mistake_of_the_file_is_reported_at_once(tmp_path: Path) -> None:
    path = hosts(tmp_path, "hosts:\n  a: {root: /q, pyhton: python3}\n  b: {root: /r, timout: 5}\nhots: {}\n")
    code, out = plan_cli("status", "a", "--hosts", str(path))
    assert code == 2
    assert "did you mean 'python'?" in out and "did you mean 'timeout'?" in out
    assert "unknown top-level key 'hots' ; did you mean 'hosts'?" in out


def test_an_unknown_host_name_suggests_the_closest(tmp_path: Path) -> None:
    path = hosts(tmp_path, "hosts:\n  a9-mega: {root: /q, ssh: a9}\n")
    code, out = plan_cli("status", "a9-mgea", "--hosts", str(path))
    assert code == 2 and "unknown host 'a9-mgea'" in out and "did you mean 'a9-mega'?" in out


def test_a_directory_named_as_a_host_is_told_to_be_given_as_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plan status q` beside a queue ./q: a name, not a path (./q); the error says how to give the path."""
    (tmp_path / "q").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLAN_HOSTS", raising=False)
    code, out = plan_cli("status", "q")
    assert code == 2 and "unknown host 'q'; for the directory q here, give it as a path: ./q" in out, out


def test_the_shipped_hosts_file_is_valid_and_its_slurm_lanes_reach_sbatch() -> None:
    table = load_hosts(REPO / "plans/hosts.yaml")
    assert set(table) >= {"a9", "demo", "lab"}
    lab = resolve("lab", REPO / "plans/hosts.yaml")
    assert lab.backend == "slurm" and lab.slurm is not None and lab.ssh == "login.lab.example"
    assert sbatch_args(lab.slurm, "gpu") == ["--gres=gpu:1", "--licenses=netgpu:1"]
    assert resolve("a9", REPO / "plans/hosts.yaml").connect_timeout == 10


def test_settings_reach_the_host(tmp_path: Path) -> None:
    path = hosts(
        tmp_path,
        "hosts:\n  box: {root: /q, ssh: box, connect_timeout: 5, ssh_options: [-F, cfg]}\n"
        "  hpc: {root: /s, backend: slurm, partition: gpu, account: lab}\n",
    )
    box = resolve("box", path)
    assert box.connect_timeout == 5 and box.ssh_options == ("-F", "cfg")
    hpc = resolve("hpc", path)
    assert hpc.slurm is not None
    assert sbatch_args(hpc.slurm, "cpu") == ["--partition=gpu", "--account=lab"]
