"""Independent check of an extraction, run with the ENGINE interpreter (torch, safetensors, datasets,
transformers): it does not use the pack's own validators, so the test does not grade itself.

    python engine_check_extract.py MODEL_DIR PREPARED_DIR HS_DIR SAMPLES_JSONL LAYER_IDS_JSON

Prints one JSON object: per-file shapes/dtypes, whether every file's token_ids equal the prepared
input_ids, whether every prepared row comes from a phase-1 conversation, and the largest difference
between the saved hidden states and a Hugging Face forward pass of the target on sample 0.
"""

import json
import sys
from pathlib import Path

import torch
from datasets import load_from_disk
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    model_dir, prepared, hs_dir, samples, layer_ids = sys.argv[1:6]
    layer_ids = json.loads(layer_ids)
    ds = load_from_disk(prepared)
    tok = AutoTokenizer.from_pretrained(model_dir)
    convs = [json.loads(line)["conversations"] for line in Path(samples).read_text().splitlines()]
    answers = [t["content"].strip() for c in convs for t in c if t["role"] == "assistant"]
    finals = [c[-1]["content"].strip() for c in convs]

    files, ids_match, finite, from_phase1, texts = [], [], [], [], []
    for i in range(len(ds)):
        ids = list(ds[i]["input_ids"])
        data = load_file(str(Path(hs_dir) / f"hs_{i}.safetensors"))
        hs = data["hidden_states"]
        files.append({"keys": sorted(data), "shape": list(hs.shape), "dtype": str(hs.dtype).replace("torch.", ""),
                      "token_ids_dtype": str(data["token_ids"].dtype).replace("torch.", "")})
        ids_match.append(data["token_ids"].tolist() == ids)
        finite.append(bool(torch.isfinite(hs).all()))
        text = tok.decode(ids)
        from_phase1.append(sum(1 for a in answers if a in text))
        texts.append(text)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    captured = {}
    model.model.norm.register_forward_hook(lambda m, inp, out: captured.__setitem__("pre_norm", inp[0]))
    ids0 = torch.tensor([list(ds[0]["input_ids"])])
    with torch.no_grad():
        ref = model(ids0, output_hidden_states=True).hidden_states
    saved = load_file(str(Path(hs_dir) / "hs_0.safetensors"))["hidden_states"]
    layers = model.config.num_hidden_layers
    diffs = []
    for slot, k in enumerate(layer_ids):
        want = captured["pre_norm"][0] if k == layers else ref[k][0]
        diffs.append(float((saved[:, slot] - want).abs().max()))
    # the same slot compared against the neighbouring layer: must NOT match (the off-by-one trap)
    off_by_one = float((saved[:, 0] - ref[layer_ids[0] + 1][0]).abs().max())
    print(json.dumps({"num_prepared": len(ds), "files": files, "ids_match": ids_match, "finite": finite,
                      "phase1_matches": from_phase1, "layer_max_abs_diff": diffs, "off_by_one_diff": off_by_one,
                      "finals_found": [any(f in t for t in texts) for f in finals]}))


if __name__ == "__main__":
    main()
