"""A CUDA "service" for the GPU tests and the handoff bench: takes GPU memory as a model server
does, prints READY, then idles (or keeps the GPU busy) until it is signalled.

    python cuda_service.py [--gib 4] [--ignore-term] [--busy]
"""

import argparse
import signal
import time

ap = argparse.ArgumentParser()
ap.add_argument("--gib", type=float, default=4.0)
ap.add_argument("--ignore-term", action="store_true", help="SIG_IGN for SIGTERM: only SIGKILL ends it")
ap.add_argument("--busy", action="store_true", help="run matrix products forever (utilisation near 100 %%)")
args = ap.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

import torch  # noqa: E402  (after the signal setup: the import takes seconds)

held = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device="cuda")
held.fill_(1)
torch.cuda.synchronize()
print("READY", flush=True)
if args.busy:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while True:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
while True:
    time.sleep(1)
