"""A GPU box in a temporary directory: sysfs, /dev and procfs roots built from the kernel's documented formats,
and real processes (a renamed `sleep`) holding its stand-in nodes open, whose fdinfo the test writes.

The procfs root holds, for each stand-in process, `fd` as a link to the real /proc/PID/fd (so what the runner
reads there is what the process really has open) and an `fdinfo/` of the test's own (the drm-usage-stats a
real driver would print for that open file). Processes not started here have no entry: a runner reading these
roots sees only this box, never the machine's or another test's processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from runner.service.gpuread import Roots

# Documentation/gpu/drm-usage-stats.rst and amdgpu_fdinfo.c: amdgpu prints the common keys, its memory regions
# (drm-total-/shared-/active-/resident-/purgeable-<region>, the older drm-memory-<region> alias) and its engines.
AMDGPU_FDINFO = """pos:\t0
flags:\t02100002
mnt_id:\t24
ino:\t1181
drm-driver:\tamdgpu
drm-client-id:\t{client}
drm-pdev:\t{pci}
pasid:\t32772
drm-total-cpu:\t0
drm-shared-cpu:\t0
drm-active-cpu:\t0
drm-resident-cpu:\t0
drm-purgeable-cpu:\t0
drm-total-gtt:\t2048 KiB
drm-shared-gtt:\t0
drm-active-gtt:\t0
drm-resident-gtt:\t2048 KiB
drm-purgeable-gtt:\t0
drm-total-vram:\t{vram_kib} KiB
drm-shared-vram:\t0
drm-active-vram:\t0
drm-resident-vram:\t{vram_kib} KiB
drm-purgeable-vram:\t0
drm-memory-cpu:\t0 KiB
drm-memory-gtt: \t2048 KiB
drm-memory-vram:\t{vram_kib} KiB
amd-evicted-vram:\t0 KiB
amd-requested-vram:\t{vram_kib} KiB
amd-requested-gtt:\t2048 KiB
drm-engine-gfx:\t{gfx_ns} ns
drm-engine-compute:\t{compute_ns} ns
"""

# i915 (Documentation/gpu/i915.rst): engine busy time in ns per engine class, capacity where a class has several.
I915_FDINFO = """pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t685
drm-driver:\ti915
drm-pdev:\t{pci}
drm-client-id:\t{client}
drm-engine-render:\t{render_ns} ns
drm-engine-copy:\t0 ns
drm-engine-video:\t0 ns
drm-engine-capacity-video:\t2
drm-engine-video-enhance:\t0 ns
drm-total-system0:\t{system_kib} KiB
drm-shared-system0:\t0
drm-active-system0:\t0
drm-resident-system0:\t{system_kib} KiB
drm-purgeable-system0:\t0
"""

# xe (Documentation/gpu/xe/xe-drm-usage-stats.rst): busy cycles and the GPU's total cycles per engine class.
XE_FDINFO = """pos:\t0
flags:\t0100002
mnt_id:\t26
ino:\t685
drm-driver:\txe
drm-client-id:\t{client}
drm-pdev:\t{pci}
drm-total-system:\t0
drm-shared-system:\t0
drm-active-system:\t0
drm-resident-system:\t0
drm-purgeable-system:\t0
drm-total-gtt:\t192 KiB
drm-shared-gtt:\t0
drm-active-gtt:\t0
drm-resident-gtt:\t192 KiB
drm-total-vram0:\t23992 KiB
drm-shared-vram0:\t16 MiB
drm-active-vram0:\t0
drm-resident-vram0:\t23992 KiB
drm-total-stolen:\t0
drm-shared-stolen:\t0
drm-active-stolen:\t0
drm-resident-stolen:\t0
drm-cycles-rcs:\t{rcs}
drm-total-cycles-rcs:\t{total}
drm-cycles-bcs:\t0
drm-total-cycles-bcs:\t{total}
drm-cycles-vcs:\t0
drm-total-cycles-vcs:\t{total}
drm-engine-capacity-vcs:\t2
drm-cycles-vecs:\t0
drm-total-cycles-vecs:\t{total}
drm-engine-capacity-vecs:\t2
drm-cycles-ccs:\t0
drm-total-cycles-ccs:\t{total}
drm-engine-capacity-ccs:\t4
"""


class GpuBox:
    def __init__(self, tmp: Path) -> None:
        self.top = tmp / "gpubox"
        self.proc, self.sys, self.dev = self.top / "proc", self.top / "sys", self.top / "dev"
        for path in (self.proc, self.sys / "class/drm", self.dev / "dri"):
            path.mkdir(parents=True, exist_ok=True)
        self.bin = self.top / "bin"
        self.bin.mkdir()
        self.started: list[subprocess.Popen[bytes]] = []

    @property
    def roots(self) -> Roots:
        return Roots(str(self.proc), str(self.sys), str(self.dev))

    def config(self) -> dict[str, str]:
        """The runner config fields that read this box."""
        return {"gpu_proc": str(self.proc), "gpu_sys": str(self.sys), "gpu_dev": str(self.dev)}

    def flags(self) -> list[str]:
        """The runner flags that read this box."""
        return ["--gpu-proc", str(self.proc), "--gpu-sys", str(self.sys), "--gpu-dev", str(self.dev)]

    def device(self, pci: str, driver: str = "amdgpu", card: int = 0, kfd_id: int | None = None) -> Path:
        """A PCI GPU with its card and render node (stand-in files under dev/dri); returns the render node."""
        pcidev = self.sys / "devices/pci0000:00" / pci
        pcidev.mkdir(parents=True)
        drivers = self.sys / "bus/pci/drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (pcidev / "driver").symlink_to(drivers)
        render = 128 + card
        for name in (f"card{card}", f"renderD{render}"):
            (self.sys / "class/drm" / name).mkdir()
            (self.sys / "class/drm" / name / "device").symlink_to(pcidev)
            (self.dev / "dri" / name).write_text("")
        (self.sys / "class/drm" / f"card{card}-HDMI-A-1").mkdir()  # a connector: not a device
        if kfd_id is not None:
            node = self.sys / "class/kfd/kfd/topology/nodes" / str(card + 1)
            node.mkdir(parents=True)
            (node / "gpu_id").write_text(f"{kfd_id}\n")
            (node / "properties").write_text(f"cpu_cores_count 0\nsimd_count 80\ndrm_render_minor {render}\n")
        return self.dev / "dri" / f"renderD{render}"

    def holder(
        self, name: str, *nodes: Path, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], list[int]]:
        """A process named NAME (a copy of sleep) holding NODES open; its fd numbers, in order. ENV: its
        environment (a runner's tag in it makes it one of that runner's jobs' processes)."""
        exe = self.bin / name
        if not exe.exists():
            shutil.copy("/bin/sleep", exe)
        fds = [os.open(node, os.O_RDONLY) for node in nodes]
        try:
            proc = subprocess.Popen([str(exe), "300"], pass_fds=fds, env=env)
        finally:
            for fd in fds:
                os.close(fd)
        self.started.append(proc)
        mine = self.proc / str(proc.pid)
        (mine / "fdinfo").mkdir(parents=True)
        (mine / "fd").symlink_to(f"/proc/{proc.pid}/fd")
        return proc, fds

    def fdinfo(self, pid: int, fd: int, text: str) -> None:
        path = self.proc / str(pid) / "fdinfo" / str(fd)
        tmp = path.with_name(f".{fd}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def kfd(self, pid: int, kfd_id: int, vram: int, sdma: int = 0, cu: int = 0) -> None:
        """/sys/class/kfd/kfd/proc/PID as kfd_process.c lays it out."""
        base = self.sys / "class/kfd/kfd/proc" / str(pid)
        (base / f"stats_{kfd_id}").mkdir(parents=True, exist_ok=True)
        (base / "pasid").write_text("32771\n")
        (base / f"vram_{kfd_id}").write_text(f"{vram}\n")
        (base / f"sdma_{kfd_id}").write_text(f"{sdma}\n")
        (base / f"stats_{kfd_id}" / "evicted_ms").write_text("0\n")
        (base / f"stats_{kfd_id}" / "cu_occupancy").write_text(f"{cu}\n")

    def close(self) -> None:
        for proc in self.started:
            proc.kill()
            proc.wait()
