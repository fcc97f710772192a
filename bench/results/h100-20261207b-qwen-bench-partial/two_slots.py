"""The interrupted benchmark's two finished slots, read from its client files (run-files.tar.gz,
h200-qwen-coder-ksweep/bench/clients/): per slot, each server's output tok/s as the pack counts a window
(its output tokens over its own duration_s; 48 requests of 128 greedy tokens at concurrency 1, taking turns
request by request), the speedups they give, and each server's mean time per output token (the pack's
TimedChat.tpot_ms). Two slots: the pack's interval needs three, so nothing here is decided.

    PYTHONPATH=. python bench/results/h100-20261207b-qwen-bench-partial/two_slots.py CLIENTS_DIR
"""
import json
import statistics
import sys
from pathlib import Path

from eagle3.openai_client import TimedChat

clients = Path(sys.argv[1])


def window(name: str, slot: int) -> tuple[float, float]:
    """(output tok/s, mean TPOT ms) of one server's share of a slot."""
    data = json.loads((clients / f"{name}-r1w{slot}-c1.json").read_text())
    chats = [TimedChat(prompt_tokens=0, **r) for r in data["requests"]]
    tpot = statistics.fmean(c.tpot_ms for c in chats if c.tpot_ms is not None)
    return sum(c.output_tokens for c in chats) / data["duration_s"], tpot


for slot in (1, 2):
    (base, tb), (k3, tk), (twin, tt) = (window(n, slot) for n in ("baseline", "k3", "baseline (twin)"))
    print(f"slot {slot}: k=3 {k3 / base:.3f}x, twin {twin / base:.3f}x (output tok/s); "
          f"mean TPOT baseline {tb:.3f} ms, k=3 {tk:.3f} ms, twin {tt:.3f} ms")
