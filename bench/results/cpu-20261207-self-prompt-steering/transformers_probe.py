import sys, json, time, torch
from transformers import AutoTokenizer, AutoModelForCausalLM
model_dir, n, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
systems = json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
torch.set_num_threads(2)
for name, system in systems.items():
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "X"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    prefix = text[: text.rindex("X")]
    ids = tok([prefix] * n, return_tensors="pt")
    torch.manual_seed(0)
    t = time.time()
    out = model.generate(**ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
                         eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>")], pad_token_id=tok.eos_token_id)
    for row in out:
        print(json.dumps({"system": name, "turn": tok.decode(row[ids["input_ids"].shape[1]:], skip_special_tokens=True)}), flush=True)
    print(f"# {name}: {time.time() - t:.0f} s; prefix={prefix!r}", file=sys.stderr, flush=True)
