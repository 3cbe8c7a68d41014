"""The gpu lane judged by use, not presence, and one job per GPU: ticks driven in-process over a GPU box built in
tmp_path (tests/gpubox.py) whose stand-in nodes real processes hold; one real runner for two jobs at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from plancompiler.report import build_report
from runner import procs
from runner.alerts.book import BOOK_FILE
from runner.views.status import render_status
from tests.conftest import RunnerProcess, plan_cli, wait_for, write_job
from tests.gpubox import AMDGPU_FDINFO, GpuBox
from tests.ticking import Ticking

A, B = "0000:03:00.0", "0000:c3:00.0"
REPO = Path(__file__).resolve().parents[2]
UNIQUE = os.getpid() % 1000  # a name of this test's own: no other runner on the machine takes it for a GPU user


def _amd(pci: str, gfx_ns: int = 0, vram_kib: int = 65536) -> str:
    return AMDGPU_FDINFO.format(pci=pci, client=14, gfx_ns=gfx_ns, compute_ns=0, vram_kib=vram_kib)


def _ticking(tmp_path: Path, box: GpuBox, *pids: int, **config: object) -> Ticking:
    q = Ticking(tmp_path / "q", gpu_names=(), **box.config(), **config)
    q.procs.gpu_pids = list(pids)
    return q


def test_a_stand_in_xorg_holding_a_node_does_not_block(tmp_path: Path, box: GpuBox) -> None:
    node = box.device(A)
    xorg, (fd,) = box.holder("Xorg", node)
    box.fdinfo(xorg.pid, fd, _amd(A, gfx_ns=123_000_000))
    q = _ticking(tmp_path, box, xorg.pid)
    write_job(q.root, "70-gpu-bench.job", "# LANE=gpu\necho bench\n")
    q.start(0.0).tick(0.0)
    assert q.procs.running() == ["70-gpu-bench.job"] and not q.events("gpu-wait")
    gpus = q.status()["gpus"]
    (held,) = gpus["holders"]
    assert held["pid"] == xorg.pid and held["who"] == "ignored" and held["gpus"] == [0]
    assert gpus["devices"][0]["ignored"] == [xorg.pid]
    shown = render_status(q.status(), 1.0)
    assert f"idle GPU holders: pid {xorg.pid}" in shown and "ignored by name" in shown
    q.close()


def test_a_stand_in_llama_server_blocks_while_its_engine_time_rises_and_not_once_idle(
    tmp_path: Path, box: GpuBox
) -> None:
    node = box.device(A)
    server, (fd,) = box.holder(f"llama-server-{UNIQUE}", node)
    box.fdinfo(server.pid, fd, _amd(A, gfx_ns=1_000_000))
    q = _ticking(tmp_path, box, server.pid, gpu_window_s=30.0)
    write_job(q.root, "70-gpu-bench.job", "# LANE=gpu\necho bench\n")
    q.start(0.0).tick(0.0)
    assert "first seen" in q.reason("70-gpu-bench.job")["detail"]  # not yet known idle: it waits the window
    for now, ns in ((10.0, 4_000_000_000), (20.0, 9_000_000_000), (30.0, 9_500_000_000)):
        box.fdinfo(server.pid, fd, _amd(A, gfx_ns=ns))
        q.tick(now)
        reason = q.reason("70-gpu-bench.job")
        assert reason["reason"] == "gpu-foreign" and "engine time rising on GPU 0" in reason["detail"]
    assert q.events("gpu-wait")[-1]["pid"] == server.pid  # said once per holder, then every --gpu-wait-repeat
    assert q.status()["gpus"]["devices"][0]["busy_pct"] == 5  # 0.5 s of gfx in the last 10 s
    q.tick(59.0)  # its engine time last rose at 30: still within the window
    assert q.procs.running() == []
    q.tick(61.0)  # no engine time for the 30 s window: an idle holder, which does not hold the lane
    assert q.procs.running() == ["70-gpu-bench.job"]
    idle = next(h for h in q.status()["gpus"]["holders"] if h["pid"] == server.pid)
    assert idle["who"] == "foreign" and idle["uses"] is False and idle["why"].startswith("idle on GPU 0")
    q.close()


def test_a_foreign_user_of_gpu_1_leaves_gpu_0_usable(tmp_path: Path, box: GpuBox) -> None:
    box.device(A, card=0)
    node_b = box.device(B, card=1)
    server, (fd,) = box.holder(f"llama-server-{UNIQUE}", node_b)
    box.fdinfo(server.pid, fd, _amd(B, vram_kib=8 * 1024 * 1024))  # a model loaded on GPU 1: 8 GiB
    q = _ticking(tmp_path, box, server.pid, gpus=[0, 1])
    write_job(q.root, "70-gpu-a.job", "# LANE=gpu\necho a\n")
    write_job(q.root, "71-gpu-b.job", "# LANE=gpu\necho b\n")
    q.start(0.0).tick(0.0)
    assert q.procs.running() == ["70-gpu-a.job"]
    env = q.procs.envs["70-gpu-a.job"]
    assert (env["CUDA_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]) == ("0", "0", "0")
    assert env["PLAN_GPU"] == "0" and q.events("start")[-1]["gpus"] == [0]
    reason = q.reason("71-gpu-b.job")
    assert reason["reason"] == "gpu-foreign" and reason["detail"].startswith(f"GPU 1: pid {server.pid} (holds 8.0 GiB")
    assert q.events("gpu-wait")[-1]["gpu"] == 1
    devices = q.status()["gpus"]["devices"]
    assert devices[0]["ours"] == ["70-gpu-a.job"] and devices[1]["foreign"] == [server.pid]
    server.kill()
    server.wait()
    q.tick(1.0)
    assert q.procs.running() == ["70-gpu-a.job", "71-gpu-b.job"]
    assert q.procs.envs["71-gpu-b.job"]["CUDA_VISIBLE_DEVICES"] == "1"
    q.close()


def test_gpu_stalled_fires_when_a_running_jobs_engine_time_stops(tmp_path: Path, box: GpuBox) -> None:
    node = box.device(A)
    q = _ticking(tmp_path, box, gpu_stall_s=60.0, stall_repeat_s=600.0)
    write_job(q.root, "10-gpu-serve.job", "# LANE=gpu\nllama-server ...\n")
    q.start(0.0).tick(0.0)
    run = q.runner.jobs.running["10-gpu-serve.job"]
    # The job's server: carries its tag as the runner's own jobs do
    server, (fd,) = box.holder(f"llama-server-{UNIQUE}", node, env={procs.TAG_VAR: run.tag})
    q.procs.gpu_pids = [server.pid]
    for now, ns in ((1.0, 0), (10.0, 3_000_000_000), (20.0, 6_000_000_000)):
        box.fdinfo(server.pid, fd, _amd(A, gfx_ns=ns))
        q.tick(now)
    assert q.status()["gpus"]["devices"][0]["ours"] == ["10-gpu-serve.job"]
    q.tick(79.0)  # its engine time last moved at 20
    assert not q.events("gpu-stalled")
    q.tick(81.0)
    (stalled,) = q.events("gpu-stalled")
    assert stalled["job"] == "10-gpu-serve.job" and stalled["gpus"] == [0] and stalled["still_s"] == 61
    (incident,) = json.loads((q.root / BOOK_FILE).read_text())["open"]  # the box's own incident book
    assert incident["id"] == "gpu-stalled:10-gpu-serve.job"
    assert "10-gpu-serve.job runs but its GPU engine time has not moved for 1m01s" in incident["text"]
    q.tick(120.0)
    assert len(q.events("gpu-stalled")) == 1  # repeated at --stall-repeat, not every tick
    box.fdinfo(server.pid, fd, _amd(A, gfx_ns=7_000_000_000))  # it works again
    q.tick(130.0)
    assert ("recovered", "gpu-stalled:10-gpu-serve.job") in [(e["what"], e["id"]) for e in q.events("incident")]
    q.procs.exit("10-gpu-serve.job", 0)
    q.tick(131.0)
    done = q.events("done")[-1]
    assert done["gpu_active_s"] == 29.0 and done["gpu_watched_s"] == 129.0  # seen from 1 on
    report = build_report(q.events())
    assert (report.totals()["gpu"]["gpu_active_s"], report.totals()["gpu"]["gpu_watched_s"]) == (29.0, 129.0)
    assert "GPU really busy     29s of 2m09s its jobs ran on it (22%)" in report.text()
    q.close()


def test_two_gpus_run_two_gpu_jobs_at_once_each_with_its_own(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    both = tmp_path / "both"
    both.mkdir()
    for name in ("70-gpu-a", "71-gpu-b"):
        # Each says its GPU, then waits for the other: both can end only if both run at once.
        write_job(
            queue_root,
            f"{name}.job",
            f"# LANE=gpu\nenv | grep -E '^(CUDA|HIP|ROCR)_VISIBLE_DEVICES=|^PLAN_GPU=' | sort > {both}/{name}\n"
            f'for _ in $(seq 200); do [ "$(ls {both} | wc -l)" = 2 ] && exit 0; sleep 0.05; done; exit 1\n',
        )
    runner.start("--gpus", "0,1", "--gpu-names", f"none-{UNIQUE}")
    for name in ("70-gpu-a.job", "71-gpu-b.job"):
        runner.wait_event("done", job=name)
    seen = {name: (both / name).read_text().split() for name in ("70-gpu-a", "71-gpu-b")}
    assert seen["70-gpu-a"] == [
        "CUDA_VISIBLE_DEVICES=0",
        "HIP_VISIBLE_DEVICES=0",
        "PLAN_GPU=0",
        "ROCR_VISIBLE_DEVICES=0",
    ]
    assert seen["71-gpu-b"] == [
        "CUDA_VISIBLE_DEVICES=1",
        "HIP_VISIBLE_DEVICES=0",
        "PLAN_GPU=1",
        "ROCR_VISIBLE_DEVICES=1",
    ]
    assert sorted(tuple(e["gpus"]) for e in runner.events("start")) == [(0,), (1,)]
    wait_for(lambda: runner.status()["lanes"]["gpu"]["slots"] == 2)


def test_plan_devices_and_a_jobs_gpus_reach_the_runner_and_the_hosts_file_wins(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    plan = tmp_path / "g.yaml"
    plan.write_text(
        "plan: g\nlanes: {net: {}, gpu: {devices: [0, 1]}, cpu: {}}\njobs:\n"
        "  - {name: 70-gpu-pair, lane: gpu, gpus: 2, run: echo pair}\n"
        "  - {name: 71-gpu-one, lane: gpu, run: echo one}\n"
    )
    code, out = plan_cli("push", str(queue_root), str(plan))
    assert code == 0, out
    assert json.loads((queue_root / "manifest.json").read_text())["gpus"] == {"gpu": [0, 1]}
    assert "# GPUS=2\n" in (queue_root / "queue/70-gpu-pair.job").read_text()
    q = ticking(1.0)
    q.tick(1.0)
    assert q.procs.running() == ["70-gpu-pair.job"]
    env = q.procs.envs["70-gpu-pair.job"]
    assert (env["CUDA_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]) == (
        "0,1",
        "0,1",
        "0,1",
    )
    one = q.reason("71-gpu-one.job")
    assert (
        one["reason"] == "lane-busy"
        and one["detail"] == "needs 1 GPU; GPU 0: 70-gpu-pair.job runs, GPU 1: 70-gpu-pair.job runs"
    )
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  box:\n    root: {queue_root}\n    gpus: [1]\n")
    q.procs.exit("70-gpu-pair.job", 0)
    code, out = plan_cli("push", "box", str(plan), "--hosts", str(hosts), "--retry-failed")
    assert code == 0, out
    assert json.loads((queue_root / "manifest.json").read_text())["gpus"] == {"gpu": [1]}
    q.tick(2.0)
    assert q.procs.envs["71-gpu-one.job"]["CUDA_VISIBLE_DEVICES"] == "1"
    bad = tmp_path / "bad.yaml"
    bad.write_text("plan: b\nlanes: {gpu: {devices: [0, 0]}}\njobs:\n  - {name: a, lane: gpu, gpus: 0, run: echo a}\n")
    code, out = plan_cli("check", str(bad))
    assert code == 1 and "bad.yaml:2:" in out and "gpu.devices: GPU indexes such as [0, 1], each once" in out, out
    assert "bad.yaml:4:" in out and "jobs[0].gpus" in out and "valid list" not in out and "Traceback" not in out


def test_runner_gpus_prints_what_it_sees(box: GpuBox) -> None:
    box.device(A, card=0)
    node_b = box.device(B, card=1)
    xorg, (xfd,) = box.holder("Xorg", box.dev / "dri/card0")
    box.fdinfo(xorg.pid, xfd, _amd(A))
    server, (fd,) = box.holder(f"llama-server-{UNIQUE}", node_b)
    box.fdinfo(server.pid, fd, _amd(B, vram_kib=8 * 1024 * 1024))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-S", "-m", "runner", "gpus", "--window", "0.3", "--gpu-names", "", *box.flags()]
    shown = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"gpu 0: {A} amdgpu  nodes {box.dev}/dri/card0 {box.dev}/dri/renderD128" in lines
    assert f"  gpu 0  {A} amdgpu  busy 0%  mem 66.0 MiB  ignored: {xorg.pid} Xorg" in lines  # vram + gtt
    assert f"  gpu 1  {B} amdgpu  busy 0%  mem 8.0 GiB  foreign: {server.pid} llama-server-{UNIQUE}" in lines
    assert any(line.startswith(f"  pid {xorg.pid} ignored gpu 0: ignored by name (--gpu-ignore)  | ") for line in lines)
    assert any(
        line.startswith(f"  pid {server.pid} foreign gpu 1: holds 8.0 GiB of GPU memory on GPU 1") for line in lines
    )
    assert any(line.startswith(f"  idle GPU holders: pid {xorg.pid}") for line in lines)
    seen = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=30).stdout)
    assert [(d["gpu"], d["foreign"], d["ignored"]) for d in seen["devices"]] == [
        (0, [], [xorg.pid]),
        (1, [server.pid], []),
    ]


def test_a_holders_long_program_path_leaves_its_name_in_status() -> None:
    """A GPU holder's command line is kept short in status.json and in `plan status`; a long path (a conda
    environment's python, a copy in a deep scratch directory) gives way to the program's base name."""
    from runner.procs import brief_command

    deep = "/home/u/miniconda3/envs/serving-2026/lib/deep/er/still/bin/llama-server --port 8080 -m model.gguf"
    assert brief_command(deep, 120) == deep
    assert brief_command(deep, 40) == "llama-server --port 8080 -m model.gguf"
    assert brief_command(deep, 20) == "llama-server --port "
    assert brief_command("/usr/bin/python3", 40) == "/usr/bin/python3"
