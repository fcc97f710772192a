"""The steered written turns at two sampling temperatures, side by side (issue 53's next lever).

Usage: python temperature_probe.py MODEL_DIR N MAX_NEW SYSTEM TEMPERATURE...
Writes one JSON line per turn ({"temperature", "turn"}) to stdout, timings to stderr.
"""
import json, sys, time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, n, max_new, system = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
temperatures = [float(t) for t in sys.argv[5:]]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
torch.set_num_threads(2)
text = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": "X"}], tokenize=False)
prefix = text[: text.rindex("X")]
ids = tok([prefix] * n, return_tensors="pt")
for temperature in temperatures:
    torch.manual_seed(0)
    t = time.time()
    out = model.generate(**ids, do_sample=True, temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new,
                         eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>")], pad_token_id=tok.eos_token_id)
    for row in out:
        turn = tok.decode(row[ids["input_ids"].shape[1]:], skip_special_tokens=True)
        print(json.dumps({"temperature": temperature, "turn": turn}), flush=True)
    print(f"# temperature {temperature}: {n} turns in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
