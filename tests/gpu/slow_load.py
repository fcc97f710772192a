"""A slow model load for the hang watchdog test: imports torch, then takes GPU memory one "shard"
at a time, logging each shard (or, with --silent, nothing), then prints READY and idles.

    python slow_load.py [--shards 25] [--every 1.0] [--mib 256] [--silent]
"""

import argparse
import time

ap = argparse.ArgumentParser()
ap.add_argument("--shards", type=int, default=25)
ap.add_argument("--every", type=float, default=1.0)
ap.add_argument("--mib", type=int, default=256)
ap.add_argument("--silent", action="store_true", help="log nothing between the import and READY")
args = ap.parse_args()

import torch  # noqa: E402

print("torch imported", flush=True)
held = []
for i in range(args.shards):
    held.append(torch.empty(args.mib * 2**20, dtype=torch.uint8, device="cuda"))
    held[-1].fill_(1)
    torch.cuda.synchronize()
    if not args.silent:
        print(f"loaded shard {i + 1}/{args.shards}", flush=True)
    time.sleep(args.every)
print("READY", flush=True)
while True:
    time.sleep(1)
