"""The interrupted benchmark's two finished slots, read from its client files (run-files.tar.gz,
h200-qwen-coder-ksweep/bench/clients/): per slot, each server's summed request latency (48 requests of
128 greedy tokens at concurrency 1, taking turns request by request) and mean time per output token,
and the speedups they give. Two slots: the pack's interval needs three, so nothing here is decided."""
import json
import statistics as st
import sys
from pathlib import Path

clients = Path(sys.argv[1])


def load(name: str, slot: int) -> list[dict]:
    return json.loads((clients / f"{name}-r1w{slot}-c1.json").read_text())["requests"]


def tpot_ms(r: dict) -> float:
    return (r["latency_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)


for slot in (1, 2):
    base, k3, twin = (load(n, slot) for n in ("baseline", "k3", "baseline (twin)"))
    lat = [sum(r["latency_ms"] for r in x) for x in (base, k3, twin)]
    tpot = [st.mean(tpot_ms(r) for r in x) for x in (base, k3, twin)]
    print(f"slot {slot}: k=3 {lat[0] / lat[1]:.3f}x, twin {lat[0] / lat[2]:.3f}x (summed latency); "
          f"mean TPOT baseline {tpot[0]:.3f} ms, k=3 {tpot[1]:.3f} ms, twin {tpot[2]:.3f} ms")
