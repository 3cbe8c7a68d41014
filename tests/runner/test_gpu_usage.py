"""GPU use, not presence: the drm-usage-stats, KFD and NVML readers, and the window a holder's use is judged
over, on a GPU box built in tmp_path with real processes holding its stand-in nodes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from runner import procs
from runner.service import gpuread
from runner.service.gpu import GpuRules, GpuWatch, Observation
from tests.gpubox import AMDGPU_FDINFO, I915_FDINFO, XE_FDINFO, GpuBox

A, B = "0000:03:00.0", "0000:c3:00.0"


def _amd(pci: str, gfx_ns: int = 0, vram_kib: int = 18624, client: int = 14) -> str:
    return AMDGPU_FDINFO.format(pci=pci, client=client, gfx_ns=gfx_ns, compute_ns=0, vram_kib=vram_kib)


def _look(box: GpuBox, watch: GpuWatch, now: float, ours: dict[int, str] | None = None) -> Observation:
    """WATCH's look at the processes BOX started (not the whole table: other tests' stand-ins run beside them,
    and a name is matched whether or not it holds a node)."""
    table = {p.pid: found for p in box.started if (found := procs.read_stat(p.pid)) is not None}
    return watch.observe(now, table, lambda proc: (ours or {}).get(proc.pid))


def _watch(box: GpuBox, **rules: object) -> GpuWatch:
    return GpuWatch(GpuRules(roots=box.roots, **rules))  # type: ignore[arg-type]


def test_fdinfo_of_each_driver_reads_as_the_kernel_documents_it() -> None:
    amd = gpuread.parse_fdinfo(_amd(A, gfx_ns=7150000, vram_kib=1024), "/dev/dri/renderD128")
    assert amd is not None and amd.driver == "amdgpu" and amd.key == (A, "14")
    assert amd.engines == {"gfx": 7150000, "compute": 0} and amd.busy == 7150000
    # total (drm-memory- is its alias, counted once): vram 1024 KiB + gtt 2048 KiB + cpu 0
    assert amd.memory == (1024 + 2048) * 1024
    i915 = gpuread.parse_fdinfo(I915_FDINFO.format(pci=A, client=7, render_ns=5, system_kib=4), "/dev/dri/card0")
    assert i915 is not None and i915.capacity == {"video": 2} and i915.busy == 5 and i915.memory == 4096
    xe = gpuread.parse_fdinfo(XE_FDINFO.format(pci=B, client=3, rcs=28257900, total=7655183225), "x")
    assert xe is not None and not xe.engines and xe.cycles["rcs"] == (28257900, 7655183225)
    assert xe.busy == 28257900 and xe.capacity["ccs"] == 4 and xe.memory == (192 + 23992) * 1024
    assert gpuread.parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t3\n", "x") is None  # not a DRM file


def test_devices_are_numbered_by_pci_address_with_their_nodes_and_kfd_ids(box: GpuBox) -> None:
    box.device(B, card=1, kfd_id=4242)
    box.device(A, driver="i915", card=0)
    found = gpuread.find_devices(box.roots)
    assert [(d.index, d.pci, d.driver) for d in found] == [(0, A, "i915"), (1, B, "amdgpu")]
    assert found[1].nodes == (str(box.dev / "dri/card1"), str(box.dev / "dri/renderD129"))
    assert found[1].kfd_ids == (4242,) and found[0].kfd_ids == ()


def test_a_display_server_holding_a_busy_node_is_ignored(box: GpuBox) -> None:
    node = box.device(A)
    xorg, (fd,) = box.holder("Xorg", node)
    box.fdinfo(xorg.pid, fd, _amd(A, gfx_ns=1))
    watch = _watch(box)
    _look(box, watch, 100.0)
    box.fdinfo(xorg.pid, fd, _amd(A, gfx_ns=9_000_000_000))
    seen = _look(box, watch, 110.0)
    assert not seen.blocking()
    (held,) = seen.holders
    assert held.pid == xorg.pid and held.who == "ignored" and held.devices == (0,)
    assert [h.pid for h in seen.idle()] == [xorg.pid] and seen.devices[0].ignored == (xorg.pid,)


def test_a_holder_blocks_while_its_engine_time_rises_and_not_once_idle_for_the_window(box: GpuBox) -> None:
    node = box.device(A)
    server, (fd,) = box.holder(f"llm-{os.getpid() % 100000}", node)
    watch = _watch(box, window_s=30.0)
    box.fdinfo(server.pid, fd, _amd(A, gfx_ns=1_000))
    first = _look(box, watch, 0.0)
    assert [h.pid for h in first.blocking()] == [server.pid] and "first seen" in first.blocking()[0].why
    box.fdinfo(server.pid, fd, _amd(A, gfx_ns=5_000_000_000))
    busy = _look(box, watch, 10.0)
    assert busy.blocking()[0].why == "engine time rising on GPU 0"
    assert busy.devices[0].busy == pytest.approx(0.5, abs=0.01)  # 5 s of gfx in 10 s
    # Its engine time rose between 0 and 10: at 30 that is still within the window, at 40 it is not.
    for now in (20.0, 30.0):
        still = _look(box, watch, now)
    assert still.blocking()[0].why == "engine time rising on GPU 0"
    quiet = _look(box, watch, 40.0)
    assert not quiet.blocking() and quiet.idle()[0].why.startswith("idle on GPU 0")
    assert quiet.devices[0].busy == 0.0 and quiet.devices[0].foreign == (server.pid,)


def test_a_holder_with_memory_over_the_threshold_blocks_though_idle(box: GpuBox) -> None:
    node = box.device(A)
    server, (fd,) = box.holder(f"llm-{os.getpid() % 100000}", node)
    box.fdinfo(server.pid, fd, _amd(A, vram_kib=2 * 1024 * 1024))
    watch = _watch(box, window_s=5.0)
    _look(box, watch, 0.0)
    seen = _look(box, watch, 60.0)
    (held,) = seen.blocking()
    assert held.why == "holds 2.0 GiB of GPU memory on GPU 0" and held.memory >= 2 << 30
    assert seen.devices[0].memory == held.memory


def test_rocm_compute_is_read_from_kfd_and_names_its_gpu(box: GpuBox) -> None:
    box.device(A, card=0, kfd_id=1111)
    box.device(B, card=1, kfd_id=2222)
    kfd_node = box.dev / "kfd"
    kfd_node.write_text("")
    worker, _ = box.holder(f"rocm-{os.getpid() % 100000}", kfd_node)
    box.kfd(worker.pid, 2222, vram=64 << 20, sdma=0, cu=0)
    watch = _watch(box, window_s=5.0)
    _look(box, watch, 0.0)
    idle = _look(box, watch, 10.0)
    assert not idle.blocking() and idle.holders[0].devices == (1,)
    box.kfd(worker.pid, 2222, vram=64 << 20, sdma=0, cu=12)  # its waves occupy 12 compute units
    busy = _look(box, watch, 12.0)
    assert busy.blocking()[0].why == "computing on GPU 1" and busy.blocking()[0].devices == (1,)


def test_a_node_whose_use_cannot_be_read_blocks_as_before(box: GpuBox) -> None:
    node = box.device(A)
    holder, _ = box.holder(f"gpuuser-{os.getpid() % 100000}", node)  # no fdinfo: presence is all there is
    seen = _look(box, _watch(box), 0.0)
    assert seen.blocking()[0].pid == holder.pid and "its use cannot be read" in seen.blocking()[0].why


def test_our_own_jobs_processes_are_ours_and_their_engine_time_is_kept_per_job(box: GpuBox) -> None:
    node = box.device(A)
    mine, (fd,) = box.holder(f"job-{os.getpid() % 100000}", node)
    watch = _watch(box)
    box.fdinfo(mine.pid, fd, _amd(A, gfx_ns=0))
    _look(box, watch, 0.0, {mine.pid: "10-gpu.job"})
    box.fdinfo(mine.pid, fd, _amd(A, gfx_ns=2_000_000_000))
    seen = _look(box, watch, 10.0, {mine.pid: "10-gpu.job"})
    assert seen.holders[0].who == "ours" and seen.devices[0].ours == ("10-gpu.job",) and not seen.blocking()
    job = watch.jobs["10-gpu.job"]
    assert job.moved_at == 10.0 and job.active_s == 10.0 and job.devices == (0,)
    _look(box, watch, 25.0, {mine.pid: "10-gpu.job"})
    assert watch.jobs["10-gpu.job"].moved_at == 10.0 and watch.jobs["10-gpu.job"].watched_s == 25.0


def test_nvml_failures_are_reported_never_an_empty_answer(
    box: GpuBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real NVML does not run here (no NVIDIA GPU): a stand-in pynvml that fails as a box without the driver
    does (NVMLError_LibraryNotFound from nvmlInit)."""
    box.device(A, driver="nvidia")
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "pynvml.py").write_text(
        "class NVMLError_LibraryNotFound(Exception):\n    pass\n\n"
        "def nvmlInit():\n    raise NVMLError_LibraryNotFound('NVML Shared Library Not Found')\n"
    )
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    seen = _look(box, _watch(box), 0.0)
    assert seen.nvml == "error" and seen.errors == ["nvml: nvmlInit: NVML Shared Library Not Found"]


STAND_IN_NVML = '''
"""A stand-in for nvidia-ml-py's pynvml (NVML does not run here): one GPU at 0000:03:00.0, 37% busy, whose one
compute process (FAKE_NVML_PID) holds FAKE_NVML_MEM bytes and ran at FAKE_NVML_SM % in the last samples."""
import os

class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetPciInfo(h): return _Obj(busId=b"00000000:03:00.0")
def nvmlDeviceGetUtilizationRates(h): return _Obj(gpu=37, memory=5)
def nvmlDeviceGetMemoryInfo(h): return _Obj(used=int(os.environ["FAKE_NVML_MEM"]) + (1 << 20), total=80 << 30)
def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Obj(pid=int(os.environ["FAKE_NVML_PID"]), usedGpuMemory=int(os.environ["FAKE_NVML_MEM"]))]
def nvmlDeviceGetGraphicsRunningProcesses(h): return []
def nvmlDeviceGetProcessUtilization(h, since):
    return [_Obj(pid=int(os.environ["FAKE_NVML_PID"]), smUtil=int(os.environ["FAKE_NVML_SM"]), timeStamp=since + 1)]
'''


def test_nvml_users_are_judged_by_their_memory_and_sm_use_on_their_gpu(
    box: GpuBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box.device(A, driver="nvidia")
    (box.dev / "nvidia0").write_text("")
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "pynvml.py").write_text(STAND_IN_NVML)
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    worker, _ = box.holder(f"cuda-{os.getpid() % 100000}")  # its /dev/nvidia* fds are not what is read: NVML is
    monkeypatch.setenv("FAKE_NVML_PID", str(worker.pid))
    monkeypatch.setenv("FAKE_NVML_MEM", str(6 << 30))
    monkeypatch.setenv("FAKE_NVML_SM", "0")
    assert str(box.dev / "nvidia0") in gpuread.find_devices(box.roots)[0].nodes  # nvidia-drm: card0 too
    watch = _watch(box, window_s=5.0)
    seen = _look(box, watch, 0.0)
    (held,) = seen.blocking()
    assert seen.nvml == "ok" and not seen.errors
    assert held.pid == worker.pid and held.why == "holds 6.0 GiB of GPU memory on GPU 0" and held.devices == (0,)
    assert seen.devices[0].busy == pytest.approx(0.37) and seen.devices[0].memory == (6 << 30) + (1 << 20)
    monkeypatch.setenv("FAKE_NVML_MEM", str(64 << 20))
    monkeypatch.setenv("FAKE_NVML_SM", "50")
    assert _look(box, watch, 10.0).blocking()[0].why == "computing on GPU 0"
    monkeypatch.setenv("FAKE_NVML_SM", "0")
    _look(box, watch, 20.0)
    assert not _look(box, watch, 30.0).blocking()  # no SM use, little memory, for the 5 s window: idle
