"""Which /dev/nvidia* files does a CUDA process hold when it may see only GPU 1?

The handoff ties an fd on /dev/nvidiaN to GPU N. If the CUDA driver opened every GPU's node
whatever CUDA_VISIBLE_DEVICES says, an fd alone could not attribute a process to a GPU; this
records what the driver actually does on the machine it runs on.

    python bench/devfile_probe.py           # prints JSON; needs >= 2 GPUs
    python bench/devfile_probe.py --smoke   # CI, no GPU: a CPU child, NVML read only where present
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eagle3.process import procfs  # noqa: E402
from eagle3.handoff.gpus import NvmlBackend, NvmlUnavailable  # noqa: E402

SMOKE = "--smoke" in sys.argv[1:]
code = "import torch, time\nx = torch.ones(1 << 28, device='cuda')\ntorch.cuda.synchronize()\nprint('READY', flush=True)\n" \
       "time.sleep(600)"
if SMOKE:
    code = "import time\nprint('READY', flush=True)\ntime.sleep(600)"
p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                     env={**os.environ, "CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
try:
    assert p.stdout.readline().strip() == "READY"
    fds = set()
    for fd in os.listdir(f"/proc/{p.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            fds.add(target)
    maps = {x for x in procfs.open_paths(p.pid, "/dev/nvidia")} - fds
    try:
        with NvmlBackend() as nv:
            per_gpu = {s.index: {"minor": s.minor, "nvml_pids": [q.pid for q in s.processes]} for s in nv.snapshot()}
    except NvmlUnavailable as e:
        if not SMOKE:
            raise
        per_gpu = {"unavailable": str(e)}
    print(json.dumps({"pid": p.pid, "visible": "1", "fds": sorted(fds), "maps_only": sorted(maps), "gpus": per_gpu},
                     indent=2))
finally:
    p.kill()
    p.wait()
