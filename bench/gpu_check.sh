#!/usr/bin/env bash
# What the runner's GPU reader sees on a box with a real GPU (docs/gpu.md), for bench/README: one short run.
# Prints, into ${OUT:-.}/gpu_check.txt: the devices and holders idle; the same while a process of this script
# loads the GPU (torch or cupy where importable, else nothing to load with); each holder's raw fdinfo DRM keys and
# the KFD files, as the kernel gave them. Reads only; installs nothing; about 30 s.
set -u
out="${OUT:-.}/gpu_check.txt"
exec > >(tee "$out") 2>&1
cd "$(dirname "$0")/.." || exit 2
echo "== $(date -u +%FT%TZ) $(uname -r) $(python3 --version 2>&1)"
python3 -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))' 2>&1 | tail -1
# shellcheck disable=SC2012  # a listing for a person to read
ls -l /dev/dri /dev/kfd /dev/nvidia* 2>&1 | head -20
echo "== idle"
timeout 60 python3 -m runner gpus --window 3s
timeout 60 python3 -m runner gpus --window 3s --json
echo "== under load"
cat > /tmp/gpu_load.py <<'EOF'
import time
try:
    import torch
    x = torch.randn(8192, 8192, device="cuda")
    end = time.time() + 20
    while time.time() < end:
        y = x @ x
    torch.cuda.synchronize()
except Exception as exc:  # no torch, no CUDA: say so
    print("no load:", type(exc).__name__, exc)
    time.sleep(20)
EOF
python3 /tmp/gpu_load.py & load=$!
sleep 8
timeout 60 python3 -m runner gpus --window 5s
echo "== raw: the load's fdinfo DRM keys and KFD files"
for fd in "/proc/$load"/fdinfo/*; do
  if grep -q '^drm-' "$fd" 2>/dev/null; then echo "-- $fd"; grep -E '^(drm-|amd-|pasid)' "$fd"; fi
done
for fd in "/proc/$load"/fd/*; do
  target=$(readlink "$fd") && case "$target" in /dev/dri/* | /dev/kfd | /dev/nvidia*) echo "$fd -> $target" ;; esac
done
find "/sys/class/kfd/kfd/proc/$load" -type f -exec grep -H . {} + 2>/dev/null | head -20
wait $load
echo "== wrote $out"
