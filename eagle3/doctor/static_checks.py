"""The preflight checks that need no engine: GPUs, model files, ports, disk, shared memory, layers, the
network exposure and the drafter, each in well under a second."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..phases import products
from ..config import PipelineConfig, default_aux_layer_ids, num_hidden_layers, remote_binds
from ..config.target_model import target_config
from ..errors import ConfigError, PipelineError
from ..fsio import read_json
from ..process.services import Supervisor
from .check import FAIL, PASS, WARN, Check

def check_aux_layers(cfg: PipelineConfig) -> Check:
    layers = num_hidden_layers(cfg.target.model)
    ids = list(cfg.extract.aux_layer_ids or default_aux_layer_ids(layers))
    if layers <= 0:
        return Check("aux-layers", FAIL, "target config.json has no num_hidden_layers", "fix the target's config")
    if len(set(ids)) != len(ids) or any(i < 0 or i >= layers for i in ids):
        return Check("aux-layers", FAIL, f"aux layer ids {ids} invalid for {layers} layers (default ids collapse "
                     "for targets under 7 layers)", "set extract.aux_layer_ids explicitly to distinct ids < layers")
    recorded = _recorded_aux_ids(cfg)
    for where, value in recorded.items():
        if value is not None and list(value) != ids:
            return Check("aux-layers", FAIL, f"{where} records aux layers {value}, the config resolves to {ids} "
                         "(F4: a format/capture mismatch gives acceptance near zero)",
                         "re-run extraction and training with one set of ids (eagle3 run --force extract)")
    return Check("aux-layers", PASS, f"{ids} (vLLM/speculators convention: input of decoder layer k) of {layers} "
                 f"layers{', consistent with ' + ', '.join(recorded) if recorded else ''}")


def _recorded_aux_ids(cfg: PipelineConfig) -> dict[str, list[int] | None]:
    found = {}
    for phase in ("extract", "train"):
        manifest = read_json(cfg.phase_dir(phase) / "manifest.json")
        if manifest:
            ids = manifest.get("aux_layer_ids_vllm", manifest.get("aux_layer_ids"))
            if ids is not None and manifest.get("include_last_layer") and phase == "extract":
                ids = [i for i in ids if i < num_hidden_layers(cfg.target.model)]
            found[f"{phase} manifest"] = ids
    return found


def check_network_exposure(cfg: PipelineConfig) -> Check:
    """Speculative and other managed flags in extra_args are refused by the config itself; what is
    left to say is a server the config lets listen beyond loopback (allow_remote)."""
    exposed = remote_binds(cfg)
    if exposed:
        return Check("network-exposure", WARN, "; ".join(exposed),
                     "bind 127.0.0.1 (drop allow_remote) unless other machines must reach the server; then set an api_key")
    return Check("network-exposure", PASS, "every server listens on loopback only")


def check_model_files(cfg: PipelineConfig) -> Check:
    model = cfg.target.model
    weights = [p.name for pat in ("*.safetensors", "*.bin", "*.pt") for p in model.glob(pat)]
    index = list(model.glob("*.index.json"))
    if not weights:
        return Check("model-files", FAIL, f"{model} has config.json but no weight files (*.safetensors, *.bin)",
                     "finish the download/copy of the model; the engine would fail only after starting")
    for idx in index:
        try:
            shards = set(json.loads(idx.read_text()).get("weight_map", {}).values())
        except ValueError:
            return Check("model-files", FAIL, f"{idx} is not valid JSON", "restore the model's index file")
        missing = sorted(s for s in shards if not (model / s).is_file())
        if missing:
            return Check("model-files", FAIL, f"{idx.name} names {len(missing)} missing shard(s), e.g. {missing[:3]}",
                         "finish the download/copy of the model")
    return Check("model-files", PASS, f"{len(weights)} weight file(s) present")


def check_ports(cfg: PipelineConfig, sup: Supervisor | None = None) -> Check:
    """A listener this run dir's own earlier run left is ended by the next run's recovery handoff
    (WARN); anyone else's would make a phase fail after its model load (FAIL, naming it)."""
    from ..handoff.core import ports_for
    from ..handoff.holders import Ownership, port_holders

    ports = ports_for(cfg, None, None)
    sup = sup or Supervisor(cfg.layout.state)
    ownership = Ownership.build(sup.registry.token, sup.registry.entries(), cfg.handoff.protected_process_names)
    listeners = port_holders(ports, ownership)
    if not listeners:
        return Check("ports", PASS, f"free: {ports}")
    who = lambda p: f"{p['port']} (PID {p['pid']}: {p['cmd']})" if p["pid"] else f"{p['port']} ({p['why']})"  # noqa: E731
    others = [who(p) for p in listeners if p["class"] != "owned"]
    if others:
        return Check("ports", FAIL, "already listening, not started by this pipeline: " + ", ".join(others),
                     "stop what listens there (it is not this pipeline's) or change the *.server.port settings")
    return Check("ports", WARN, "a dead earlier run of this run dir left listeners: "
                 + ", ".join(who(p) for p in listeners),
                 "nothing to do: `eagle3 run` ends them in its recovery handoff (or run `eagle3 handoff CONFIG`)")


def check_gpus(cfg: PipelineConfig, backend=None) -> Check:
    if not cfg.gpus:
        return Check("gpus", PASS, "CPU rehearsal: no GPUs configured, nothing to verify")
    from ..handoff.gpus import NvmlBackend

    try:
        backend = backend or NvmlBackend()
        states = {s.index: s for s in backend.snapshot(None)}
    except PipelineError as exc:
        return Check("gpus", FAIL, f"cannot verify the GPUs: {exc}", "fix the NVIDIA driver / NVML, or set gpus: []")
    missing = [i for i in cfg.gpus if i not in states]
    if missing:
        return Check("gpus", FAIL, f"GPU ids {missing} not present (have {sorted(states)})", "fix 'gpus'")
    busy = [f"GPU {i}: {states[i].used_mib:.0f} MiB used, PIDs {[p.pid for p in states[i].processes]}"
            for i in cfg.gpus if states[i].used_mib > cfg.handoff.used_mib_threshold or states[i].processes]
    if busy:
        return Check("gpus", FAIL, "; ".join(busy), "free them (eagle3 handoff CONFIG ends what this pipeline owns)")
    return Check("gpus", PASS, f"GPUs {cfg.gpus} free (≤ {cfg.handoff.used_mib_threshold} MiB v2 used, no processes)")


def check_disk(cfg: PipelineConfig) -> Check:
    """The hidden-state mode decision (eagle3/phases/hs_mode.py): the offline estimate, the free space
    under run_dir and the choice; FAIL with both numbers when neither mode fits."""
    from ..phases.hs_mode import NoModeFits, decide_now

    try:
        d = decide_now(cfg)
    except NoModeFits as e:
        return Check("disk", FAIL, str(e), "free disk under run_dir, or set hidden_states.server_gpus and "
                     "hidden_states.train_gpus so that training can run online")
    except ConfigError as e:  # the target's config says too little to estimate (its own check fails)
        return Check("disk", WARN, f"cannot estimate the hidden states: {e}")
    detail = (f"hidden states {d.line()}; estimate: {d.estimate}"
              + ("" if d.mode == "offline" else f"; online cache bound {_gb(d.cache_bound)}"))
    if d.mode == "offline" and d.offline_bytes > d.usable_bytes:
        return Check("disk", FAIL, detail, "free space, move run_dir, raise extract.max_disk_bytes, or set "
                     "hidden_states.mode to auto/online")
    return Check("disk", PASS, detail)


def check_shm(cfg: PipelineConfig, shm_dir: Path | None = None) -> Check:
    shm = shm_dir or cfg.handoff.shm_dir
    try:
        st = os.statvfs(shm)
    except OSError as exc:
        return Check("shm", WARN, f"cannot read {shm}: {exc}")
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    tp = cfg.target.tensor_parallel_size
    need = 64 * 2**20 if tp == 1 else 1024 * 2**20 * tp  # NCCL + vLLM's shm broadcast grow with TP ranks
    if free < need:
        return Check("shm", FAIL, f"{shm} has {_gb(free)} free of {_gb(total)}; TP={tp} needs ≥ {_gb(need)} "
                     "(NCCL 'No space left on device' / bus errors otherwise)",
                     "enlarge /dev/shm (docker --shm-size) or purge leftovers with `eagle3 handoff`")
    return Check("shm", PASS, f"{shm}: {_gb(free)} free, TP={tp}")


def tp_splits(heads: int, kv_heads: int, tp: int) -> bool:
    """Whether `tp` ranks split the attention evenly, as vLLM's and SGLang's parallel layers demand: the
    query heads divided among them, the KV heads divided too, or (fewer KV heads than ranks) replicated
    a whole number of times."""
    return heads % tp == 0 and (kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0)


def check_tensor_parallel(cfg: PipelineConfig) -> Check | None:
    """A tensor-parallel size the target's heads cannot be split by: the engine refuses it only after
    its imports and weight load (SmolLM2-135M's 9 query / 3 KV heads allow 1 or 3, never 2)."""
    tp = cfg.target.tensor_parallel_size
    if tp == 1:
        return None
    try:
        config = target_config(cfg.target.model)
    except ConfigError as e:
        return Check("tensor-parallel", FAIL, str(e), "restore the model's config.json")
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    heads, kv = text.get("num_attention_heads"), text.get("num_key_value_heads", text.get("num_attention_heads"))
    where = f"{cfg.target.model}/config.json"
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (heads, kv)):
        return Check("tensor-parallel", WARN, f"{where} gives no head counts (num_attention_heads, "
                     f"num_key_value_heads): whether TP={tp} splits them is found only when the engine loads it")
    if tp_splits(heads, kv, tp):
        return Check("tensor-parallel", PASS, f"TP={tp} splits {heads} query / {kv} KV heads evenly")
    sizes = [n for n in range(1, max(len(cfg.gpus), 1) + 1) if tp_splits(heads, kv, n)]
    copies = len(cfg.gpus) // max(sizes)
    return Check("tensor-parallel", FAIL,
                 f"target.tensor_parallel_size {tp} does not split the {heads} query / {kv} KV heads of {where} "
                 "evenly: the engine would refuse it after its imports and weight load",
                 f"set target.tensor_parallel_size to {' or '.join(map(str, sizes))} (the sizes up to the "
                 f"{len(cfg.gpus)} GPUs in 'gpus' that split these heads)"
                 + (f"; to use all {len(cfg.gpus)} GPUs, serve {copies} copies of TP {max(sizes)}: "
                    f"target.data_parallel_size: {copies}" if copies > 1 else ""))


def check_drafter(cfg: PipelineConfig) -> Check | None:
    """The drafter the benchmark will serve: bench.drafter if set, else the train phase's (once trained)."""
    from ..phases.bench_inputs import drafter_gate

    if cfg.bench.drafter is not None:
        drafter = {"path": str(cfg.bench.drafter), "source": "bench.drafter"}
    elif manifest := products.trained_drafter(cfg, required=False):
        drafter = {"path": manifest["checkpoint"], "aux_layer_ids_vllm": manifest.get("aux_layer_ids_vllm"),
                   "source": "train manifest"}
    else:
        return None
    report, source = drafter_gate(cfg, drafter)
    path, ids = drafter["path"], drafter.get("aux_layer_ids_vllm")
    if not report.ok:
        return Check("drafter-gate", FAIL, f"{source} {path}: " + "; ".join(f"{p.where}: {p.message}"
                                                                             for p in report.problems),
                     f"`eagle3 export-drafter` for {cfg.bench.engine}, or retrain (F7: unmatched weights are "
                     "dropped silently by SGLang)")
    return Check("drafter-gate", PASS, f"{path} has every weight {cfg.bench.engine} loads, aux ids {ids}")


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n < 2**40 else f"{n / 2**40:.2f} TiB"
