"""Export a drafter checkpoint into the layout a serving engine loads, in pure Python.

The weights file is rewritten with renamed keys only: a new safetensors header, then the original
tensor bytes copied unchanged (offsets are relative to the data buffer, so they stay valid). The
whole export is written into a scratch dir beside the destination and renamed into place, so the
destination is either absent, the previous export, or complete.

  to sglang: layers.0.* -> midlayer.*, layers.i.* -> additional_layers.{i-1}.*; config in the EAGLE
             layout (architectures ["LlamaForCausalLMEagle3"], Llama fields top-level, aux ids in
             eagle_config in SGLang's convention).
  to vllm:   midlayer.* -> layers.0.*, additional_layers.j.* -> layers.{j+1}.*; aux ids written
             top-level in the vllm convention. A speculators checkpoint is kept as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import uuid
from pathlib import Path

from .formats import (EAGLE_LAYOUT, LAYER_INPUT, LAYER_OUTPUT, LAYOUT_CONVENTION, SGLANG_ARCH, layout_of, DrafterConfig, from_layer_input, parse_config, to_layer_input)
from ..errors import ConfigError, GateError, echo
from ..fsio import atomic_write_json, fsync_dir
from ..inputfiles import MAX_JSON_BYTES, read_capped
from ..safetensors_header import Header, read_header

COPY_CHUNK = 16 * 1024 * 1024
CONFIG_DROP = ("speculators_model_type", "speculators_version", "speculators_config", "auto_map",
               "transformer_layer_config", "eagle_aux_hidden_state_layer_ids")


def rename_for(layout: str, name: str) -> str:
    if layout == EAGLE_LAYOUT:
        if name.startswith("layers.0."):
            return "midlayer." + name[len("layers.0."):]
        m = re.match(r"layers\.(\d+)\.(.*)", name)
        if m:
            return f"additional_layers.{int(m.group(1)) - 1}.{m.group(2)}"
        return name
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    m = re.match(r"additional_layers\.(\d+)\.(.*)", name)
    if m:
        return f"layers.{int(m.group(1)) + 1}.{m.group(2)}"
    return name


def write_renamed(src: Path, dst: Path, rename) -> dict[str, str]:
    """Copy a safetensors file with renamed tensors. Returns {old: new} for the names that changed."""
    header: Header = read_header(src)
    data_start = min((t.begin for t in header.tensors.values()), default=8)
    if not header.tensors:
        data_start = header.file_size
    doc: dict = {"__metadata__": header.metadata} if header.metadata else {}
    changed = {}
    for t in sorted(header.tensors.values(), key=lambda t: t.begin):
        new = rename(t.name)
        if new in doc:
            raise GateError(f"{src}: renaming gives two tensors the name {new!r}; the checkpoint holds both "
                            f"{t.name!r} and a tensor that already maps there; remove one")
        if new != t.name:
            changed[t.name] = new
        doc[new] = {"dtype": t.dtype, "shape": list(t.shape),
                    "data_offsets": [t.begin - data_start, t.end - data_start]}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data buffer 8-byte aligned, as the reference writer does
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(struct.pack("<Q", len(raw)))
        fout.write(raw)
        fin.seek(data_start)
        shutil.copyfileobj(fin, fout, COPY_CHUNK)
        fout.flush()
        os.fsync(fout.fileno())
    return changed


def _layer_fields(c: DrafterConfig) -> dict:
    return c.raw["transformer_layer_config"] if c.layout == "speculators" else \
        {k: v for k, v in c.raw.items() if k not in CONFIG_DROP and k != "eagle_config"}


def sglang_config(c: DrafterConfig, aux_ids_layer_input: list[int]) -> dict:
    out = dict(_layer_fields(c))
    out.update({
        "architectures": [SGLANG_ARCH], "model_type": "llama",
        "num_hidden_layers": c.num_layers, "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size or c.vocab_size,
        "tie_word_embeddings": c.tie_word_embeddings,
        "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
        "norm_output": c.norm_output, "fc_norm": c.fc_norm,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": from_layer_input(aux_ids_layer_input, LAYER_OUTPUT),
                         "use_aux_hidden_state": True},
    })
    if c.target_hidden_size != c.hidden_size:
        out["target_hidden_size"] = c.target_hidden_size
    for key in ("layer_types", "use_sliding_window", "sliding_window"):
        out.pop(key, None)  # speculators' sliding-window defaults (window >= context) mean full attention
    rope = out.get("rope_parameters") or {}
    if "rope_theta" in rope:
        out.setdefault("rope_theta", rope["rope_theta"])  # older transformers (SGLang's) read it top-level
    return out


def vllm_config(c: DrafterConfig, aux_ids_layer_input: list[int]) -> dict:
    out = dict(c.raw)
    out["eagle_aux_hidden_state_layer_ids"] = list(aux_ids_layer_input)
    if c.layout == "eagle":
        eagle = dict(out.get("eagle_config") or {})
        eagle["eagle_aux_hidden_state_layer_ids"] = list(aux_ids_layer_input)
        out["eagle_config"] = eagle
        if not set(out.get("architectures") or []) & {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}:
            out["architectures"] = [SGLANG_ARCH]
    return out


def export_drafter(src: Path | str, dst: Path | str, engine: str, source_convention: str | None = None) -> Path:
    """Write `src` in `engine`'s layout to `dst` (replaced if it exists). `source_convention` is how
    the ids stored in `src` are meant; default: "vllm" for a speculators checkpoint,
    "sglang" for an EAGLE-layout one (SpecForge/SGLang)."""
    layout = layout_of(engine)
    src, dst = Path(src), Path(dst).absolute()
    try:  # read_capped: a FIFO or device in place of the file must not block the export
        raw = json.loads(read_capped(src / "config.json", MAX_JSON_BYTES, "config.json"))
    except ConfigError as e:  # not a readable file: the checkpoint fails, as check-drafter's gate says (exit 1)
        raise GateError(str(e)) from None
    except (ValueError, RecursionError) as e:
        raise GateError(f"{src}/config.json is not valid JSON ({echo(str(e), 200, quote=False)})") from None
    c, problems = parse_config(raw) if isinstance(raw, dict) else (None, ["config.json must hold a JSON object"])
    if c is None:
        raise GateError(f"{src}/config.json cannot be exported: " + "; ".join(map(str, problems)))
    if not c.aux_ids:
        raise GateError(f"{src}/config.json: {c.aux_ids_field} is missing; the export cannot tell which layers the "
                        "drafter was trained on (set it, then export again)")
    convention = source_convention or (LAYER_INPUT if c.layout == "speculators" else LAYER_OUTPUT)
    ids = to_layer_input(c.aux_ids, convention)
    dst.parent.mkdir(parents=True, exist_ok=True)
    work = dst.parent / f".{dst.name}.export-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        write_renamed(src / "model.safetensors", work / "model.safetensors", lambda n: rename_for(layout, n))
        config = sglang_config(c, ids) if layout == EAGLE_LAYOUT else vllm_config(c, ids)
        atomic_write_json(work / "config.json", config)
        for extra in ("generation_config.json",):
            if (src / extra).is_file():
                shutil.copy2(src / extra, work / extra)
        atomic_write_json(work / "eagle3-export.json", {
            "source": str(src.absolute()), "engine": engine, "aux_layer_ids_layer_input": ids,
            "aux_layer_ids_stored": config.get("eagle_aux_hidden_state_layer_ids")
            or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            "stored_convention": LAYOUT_CONVENTION[layout]})
        old = None
        if dst.exists():
            old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(dst, old)
        os.rename(work, dst)
        fsync_dir(dst.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dst
