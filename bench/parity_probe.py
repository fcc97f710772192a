"""What produced bench/results/parity-probe-cpu-20261130.txt: one vLLM CPU server with the trained
tiny drafter fixture (k=3) and chat completions on prompt subsets of configs/prompts/tiny-prompts.jsonl
(rows 1-64 trained on, 65+ held out), greedy or sampled as the data generation did; acceptance from
the server's /metrics deltas. Why the serve-parity gate samples spread rows and is loose (eagle3/bench/gates.py).

    .venv/bin/python bench/parity_probe.py SCRATCH_DIR
    .venv/bin/python bench/parity_probe.py SCRATCH_DIR --smoke   # CI: one subset of 2 prompts, 8 tokens
"""
import json
import sys
from pathlib import Path

import httpx
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from eagle3.engines.metrics import acceptance
from eagle3.engines.vllm import read_counters
from eagle3.engines.serving import api_key, base_url, start_server
from eagle3.process.services import Supervisor, state_dir_for
from eagle3.prompts import load_prompts
from tests.conftest import write_tiny_config
from tests.ports import free_port
FIX = REPO / "tests" / "fixtures" / "eagle3-tiny"
SMOKE = "--smoke" in sys.argv[2:]
cfg = write_tiny_config(Path(sys.argv[1]), {"target": {"model": str(FIX / "target")}, "bench": {"server": {"port": free_port()}}})
sup = Supervisor(state_dir_for(cfg.run_dir))
url = base_url(cfg.bench.server)
ps = load_prompts(cfg.datagen.prompts).prompts
srv = start_server(sup, cfg, "bench", "vllm", cfg.bench.server, extra_args=["--speculative-config", json.dumps({"method": "eagle3", "model": str(FIX / "drafter-trained"), "num_speculative_tokens": 3})])
try:
    headers = {"Authorization": f"Bearer {api_key(cfg, cfg.bench.server, 'bench.server')}"}  # the run's own key

    def run(name, rows, **samp):
        before = read_counters(url)[0]
        for p in rows:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120, headers=headers, json={"model": cfg.target.served_name, "messages": list(p.messages), **samp})
            assert r.status_code == 200, r.text
        a = acceptance(read_counters(url)[0] - before)
        print(name, samp, round(a.acceptance_length, 3), [round(x, 3) for x in a.per_position], flush=True)
    g32 = dict(max_tokens=32, temperature=0.0)
    if SMOKE:
        run("smoke rows 0-1", ps[0:2], max_tokens=8, temperature=0.0)
        raise SystemExit(0)
    run("rows 0-7", ps[0:8], **g32)
    run("rows 12-19", ps[12:20], **g32)
    run("spread 0,8..56", ps[0:64:8], **g32)
    run("spread 4,12..60", ps[4:64:8], **g32)
    run("spread T0.8", ps[0:64:8], max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
    run("spread T0.8 96", ps[0:64:8], max_tokens=96, temperature=0.8, top_p=0.95, seed=0)
    run("heldout 64-71", ps[64:72], **g32)
    run("heldout T0.8", ps[64:72], max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
finally:
    srv.stop()
