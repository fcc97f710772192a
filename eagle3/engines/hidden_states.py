"""vLLM in extract-hidden-states mode: the extra server flags and environment.

One server serves both halves of phase 2: the render endpoint that `speculators prepare-data`
needs (rendering only applies the chat template, the extraction config does not touch it; vLLM
0.32 opens it only with `--enable-scale-out`, 0.25 has no such flag and always opens it), and the extract_hidden_states speculative method plus the hidden-states
KV connector make every completion request write its prompt's hidden states to a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .probe import engine_accepts

ENGINE_SIDE_DIR = Path(__file__).resolve().parent.parent / "engine_side"
GPU_CONNECTOR = "ExampleHiddenStatesConnector"  # vLLM's own, registered by name
CPU_CONNECTOR = "CpuHiddenStatesConnector"      # ours: eagle3/engine_side/cpu_hidden_states_connector.py
CPU_CONNECTOR_MODULE = "cpu_hidden_states_connector"


def server_args(layer_ids: list[int], staging_dir: Path, cpu: bool, scale_out_flag: bool = True) -> list[str]:
    """Flags appended to `vllm serve`. `layer_ids` are in vLLM's convention (id k = the hidden state
    entering decoder layer k; id L = the last layer's output before the final norm); the files hold
    them in this order. `staging_dir` is where the connector writes before the client moves each
    file into place: keep it on the output's filesystem so the move is an atomic rename.
    `scale_out_flag`: whether this vLLM's parser has `--enable-scale-out` (eagle3.engines.probe)."""
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
    transfer: dict = {"kv_connector": CPU_CONNECTOR if cpu else GPU_CONNECTOR,
                      "kv_role": "kv_producer",
                      "kv_connector_extra_config": {"shared_storage_path": str(staging_dir)}}
    if cpu:
        transfer["kv_connector_module_path"] = CPU_CONNECTOR_MODULE
    return [*(["--enable-scale-out"] if scale_out_flag else []),
            "--speculative-config", json.dumps(speculative, separators=(",", ":")),
            "--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]


def server_env(cpu: bool, engine_env: dict[str, str]) -> dict[str, str]:
    """The CPU connector is imported by the engine's worker process by module name, so its
    directory goes on PYTHONPATH (inherited by the processes vLLM spawns)."""
    if not cpu:
        return {}
    existing = engine_env.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ENGINE_SIDE_DIR), existing) if p)}


def extraction_flags(cfg, sup, engine: str, layer_ids: list[int], dtype: str, storage: Path) -> list[str]:
    """The extraction server's flags, for the extract phase and the online train step alike. Whether
    the render endpoint needs --enable-scale-out is the installed vLLM's own answer (one probe per run dir)."""
    extra = server_args(layer_ids, storage, cpu=cfg.cpu_rehearsal,
                        scale_out_flag=engine_accepts(cfg, sup, engine, "--enable-scale-out"))
    # Each request is a prepared sample (<= seq_length tokens) plus one generated token.
    if cfg.extract.seq_length + 1 > cfg.target.max_model_len:
        extra += ["--max-model-len", str(cfg.extract.seq_length + 1)]
    if cfg.extract.hidden_states_dtype not in ("auto", cfg.target.dtype):
        extra += ["--dtype", dtype]  # the saved dtype is the dtype the server computes in
    return extra
