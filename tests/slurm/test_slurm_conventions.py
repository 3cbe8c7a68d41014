"""HPC conventions of the Slurm backend: the wrapper lints clean, jobs get only their lane's environment and
resources, and retired jobs are cancelled in one scancel call."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from plancompiler.backends.slurm import sbatch_args, with_gpus
from plancompiler.hostsfile import SlurmHostEntry
from plancompiler.lint import _SHELLCHECK_ARGS
from plancompiler.tools import find_tool
from runner.slurm.agent import wrapper
from runner.slurm.bundle import PushJob
from runner.slurm.wrapper import sbatch_options
from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm
from tests.slurm.jobs import attempts, cancel_root, ended, time_limit, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli

JOB = PushJob(
    name="odd-name_1",
    hash="0123456789ab",
    text="true\n",
    env={"A": "it's $HOME `x`", "B": ""},
    timeout_s=61,
    sbatch=("--gres=gpu:1",),
)


def test_the_wrapper_is_bash_n_and_shellcheck_clean_for_awkward_paths_and_values(tmp_path: Path) -> None:
    root = str(tmp_path / "a root with 'quotes' and $dollars")
    script = tmp_path / "w.sbatch"
    script.write_text(wrapper(root, JOB, "pl", slurm_conf="/etc/slurm conf/slurm.conf"))
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0 and check.stderr == ""
    lint = subprocess.run(
        [find_tool("shellcheck") or "shellcheck", *_SHELLCHECK_ARGS[1:], str(script)], capture_output=True, text=True
    )  # as every rendered job is linted
    assert lint.returncode == 0, lint.stdout
    # the values come back exactly, as bash reads them
    shown = subprocess.run(
        ["bash", "-c", f'source <(grep \'^export [AB]=\' {json.dumps(str(script))}); printf "%s|%s" "$A" "$B"'],
        capture_output=True,
        text=True,
    ).stdout
    assert shown == "it's $HOME `x`|"
    options = sbatch_options(root, "pl", JOB)
    assert "--export=ALL" in options and f"--chdir={root}" in options and "--time=2" in options
    assert "--job-name=pl/odd-name_1" in options and options[-1] == "--gres=gpu:1"


def test_lane_settings_become_sbatch_options() -> None:
    host = SlurmHostEntry.model_validate(
        {
            "root": "/r",
            "account": "proj",
            "qos": "normal",
            "lanes": {
                "gpu": {"gres": "gpu:a100:1", "mem": "32G", "cpus": 8, "partition": "gpu", "qos": "high"},
                "cpu": {"mem": "2G"},
            },
        }
    )
    assert sbatch_args(host, "gpu") == [
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--mem=32G",
        "--cpus-per-task=8",
        "--gres=gpu:a100:1",
        "--licenses=netgpu:1",
    ]
    assert sbatch_args(host, "cpu") == ["--account=proj", "--qos=normal", "--mem=2G"]


def test_jobs_get_only_their_lanes_environment_and_resources(
    tmp_path: Path, slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAN_LEAK", "leaked")  # in the submitter's environment: must not reach the job
    root, out = tmp_path / "submit", tmp_path / "env.out"
    p = write_plan(
        tmp_path / "ev.yaml",
        "ev",
        f'  - name: show\n    run: env > {out}.env; echo "G=$GREETING L=${{PLAN_LEAK:-none}}" > {out}\n'
        f"    outputs: ['{out}']\n",
    )
    hosts = slurm.hosts_file(
        root,
        extra="    lanes:\n      cpu: {env: {GREETING: 'hi $there'}, mem: 100M, cpus: 2,"
        " partition: debug, time: '3'}\n",
    )
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        job_id = attempts(root, "ev", "show")[0]["id"]
        shown = subprocess.run(
            ["scontrol", "show", "job", str(job_id)], capture_output=True, text=True, env=slurm.env
        ).stdout
        # Slurm's own tool shows what the job is: its options as #SBATCH lines and its body
        script = subprocess.run(
            ["scontrol", "write", "batch_script", str(job_id), "-"], capture_output=True, text=True, env=slurm.env
        ).stdout
        wait_for(lambda: ended(root, "ev", "show"), 60, 0.2)
    finally:
        cancel_root(slurm, root)
    assert out.read_text() == "G=hi $there L=none\n"
    assert "#SBATCH --job-name=ev/show\n" in script and "#SBATCH --mem=100M\n" in script, script
    assert f"#   env > {out}.env; echo" in script and "the body of show" in script, script
    # exactly the lane's env, the wrapper's, Slurm's SLURM_* and a plain few: no login profile (which
    # --export=NONE loaded), nothing of the submitting process
    names = {line.split("=", 1)[0] for line in Path(f"{out}.env").read_text().splitlines() if "=" in line}
    assert "PLAN_LOGIN_PROFILE" not in names
    assert {n for n in names if not n.startswith(("SLURM_", "SLURMD_"))} == {
        "GREETING",
        "PYTHONPATH",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "ENVIRONMENT",
        "PWD",
        "SHLVL",
        "_",
        "HOSTNAME",
        "TMPDIR",
        "OLDPWD",
    }, names
    fields = dict(w.split("=", 1) for w in shown.split() if "=" in w)
    assert fields["MinMemoryNode"] == "100M" and fields["NumCPUs"] == "2" and fields["Partition"] == "debug"
    assert time_limit(slurm, job_id) == "00:03:00"


def test_retired_jobs_are_cancelled_in_one_scancel_call(
    tmp_path: Path, slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.which("scancel")
    assert real
    shims, calls = tmp_path / "bin", tmp_path / "scancel.calls"
    shims.mkdir()
    (shims / "scancel").write_text(f'#!/bin/bash\necho "$*" >> {calls}\nexec {real} "$@"\n')
    (shims / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{subprocess.os.environ['PATH']}")
    root = tmp_path / "submit"
    hold = f"  - name: hold\n    run: sleep 20; touch {tmp_path}/h\n    outputs: ['{tmp_path}/h']\n"
    extra = "".join(f"  - name: x{i}\n    run: 'true'\n    requires: [{{after: hold}}]\n" for i in range(3))
    p = write_plan(tmp_path / "sc.yaml", "sc", hold + extra)
    hosts = slurm.hosts_file(root)
    try:
        assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
        ids = sorted(attempts(root, "sc", f"x{i}")[0]["id"] for i in range(3))
        p.write_text(f"plan: sc\njobs:\n{hold}")
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and out.count("  -  x") == 3, out
    finally:
        cancel_root(slurm, root)
    first = calls.read_text().splitlines()[0]
    assert sorted(int(x) for x in first.split()) == ids


def test_a_jobs_gpus_are_its_gres_count() -> None:
    host = SlurmHostEntry.model_validate({"root": "/r", "lanes": {"gpu": {"gres": "gpu:a100:1,nvme:1"}}})
    assert sbatch_args(host, "gpu", 2) == ["--gres=gpu:a100:2,nvme:1", "--licenses=netgpu:1"]
    assert sbatch_args(host, "cpu", 3) == ["--gres=gpu:3"]  # a lane that asks for none
    assert with_gpus("gpu", 2) == "gpu:2" and with_gpus("gpu:1", None) == "gpu:1"


def test_gpus_go_to_slurm_as_gres_and_a_cluster_without_them_refuses_the_push_whole(
    tmp_path: Path, slurm: Slurm
) -> None:
    """The test cluster has one (fake) GPU: `gpus: 2` is more than it has, and sbatch says so."""
    root = tmp_path / "submit"
    one = "  - name: one\n    lane: gpu\n    gpus: 1\n    run: echo $CUDA_VISIBLE_DEVICES\n"
    p = write_plan(tmp_path / "gp.yaml", "gp", one + "  - name: two\n    lane: gpu\n    gpus: 2\n    run: 'true'\n")
    hosts = slurm.hosts_file(root)
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 1, out
    assert "gp/two failed: sbatch: error: Batch job submission failed: Requested node configuration is not " in out
    assert "were cancelled" in out and "pushed: 0 submitted" in out, out

    # nothing of the push pends or runs: `one` was cancelled, and Slurm keeps the job it refused as FAILED
    # (a cancelled job that had reached its node reads COMPLETING for a moment while Slurm ends it there)
    def states() -> dict[str, str]:
        return {j["name"]: j["state"] for j in slurm.squeue() if j["name"].startswith("gp/")}

    wait_for(lambda: "COMPLETING" not in states().values(), 30, 0.2)
    assert states() == {"gp/one": "CANCELLED", "gp/two": "FAILED"}, states()
    assert json.loads((root / "slurm.json").read_text())["plans"] == {}  # none of the push's jobs in the ledger
    p.write_text(f"plan: gp\njobs:\n{one}")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        job_id = attempts(root, "gp", "one")[0]["id"]
        script = subprocess.run(
            ["scontrol", "write", "batch_script", str(job_id), "-"], capture_output=True, text=True, env=slurm.env
        ).stdout
        wait_for(lambda: ended(root, "gp", "one"), 60, 0.2)
    finally:
        cancel_root(slurm, root)
    assert "#SBATCH --gres=gpu:1\n" in script, script
    assert ended(root, "gp", "one") == "COMPLETED"
