#!/usr/bin/env bash
# What produced tests/gpu/RESULTS.md and bench/RESULTS.md: the GPU tests, the device-file probe
# and the handoff bench, in one go on a GPU machine. Results go to $OUT (default ./gpu-results).
# Needs torch, pynvml, psutil, pyyaml, typer, rich, pytest, pytest-timeout and pydantic importable;
# PYTHONPATH must include the repo root.
set -uo pipefail
OUT=${OUT:-./gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export EAGLE3_GPU_RESULTS="$OUT/gpu_results.jsonl"
{
  date -u; python3 -V; uname -r; nproc
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.reserved,persistence_mode --format=csv
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-ml-py|psutil|pytest) '
  echo "--- GPU device-file holders before anything starts (preflight handoff, no services):"
  mkdir -p /tmp/preflight && python3 -m eagle3.cli handoff --run-dir /tmp/preflight --gpus "${GPUS:-0,1}" --json
  echo "--- eagle3 gpus:"; python3 -m eagle3.cli gpus
} > "$OUT/machine.txt" 2>&1
python3 bench/devfile_probe.py > "$OUT/devfiles.json" 2>&1
# The survivor-of-SIGKILL test needs a cgroup-v1 freezer (root); it skips without one.
grep -qE '^\S+ \S+ cgroup \S*freezer' /proc/mounts || { mkdir -p /tmp/fz && mount -t cgroup -o freezer freezer /tmp/fz 2>/dev/null; }
timeout 540 python3 -m pytest tests/gpu/test_handoff_gpu.py tests/gpu/test_node_safety_gpu.py -v -p no:cacheprovider 2>&1 \
  | tee "$OUT/pytest.log"
timeout 240 python3 bench/handoff_bench.py --pack-rounds "${PACK_ROUNDS:-10}" --ritual-rounds "${RITUAL_ROUNDS:-3}" \
  --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
