"""Preflight doctor: what can be known before paying for a long model load, said in seconds.

Every check yields one line: PASS / WARN / FAIL, why, and what to do. The checks that need an
engine run its own interpreter (`engine_side/inspect_target.py`) and never load weights; their
answers are cached per (engine interpreter, target config) in the run dir.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from . import handover, phase_table, progress
from .config import PipelineConfig, default_aux_layer_ids, num_hidden_layers, remote_binds
from .config.target_model import target_config
from .errors import ConfigError, PipelineError
from .fsio import atomic_write_json, read_json
from .engines import engine_registry, trainer_compat
from .engines.probe import import_errors, inspect_engine
from .process.services import Supervisor

log = logging.getLogger("eagle3.doctor")

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    reason: str
    fix: str = ""
    seconds: float = 0.0


class DoctorFailed(PipelineError):
    """At least one preflight check failed: the run must not start. Its message is one line (the
    first cause and its fix); each failed check is a line of the doctor's own output (and of the
    preflight task's log) with its fix, so no message says any of them twice."""

    def __init__(self, checks: list[Check]):
        bad = [c for c in checks if c.status == FAIL]
        more = f" (and {len(bad) - 1} more failed check(s), each logged with its fix)" if len(bad) > 1 else ""
        first = bad[0] if bad else None
        head = (f"preflight failed: {first.name}: {first.reason}" + (f"; fix: {first.fix}" if first.fix else "")
                if first else "preflight failed")
        super().__init__(head + more)
        self.checks = checks


# ---- engine-side probes (eagle3/engines/probe.py) ------------------------------------------

def check_engine_env(cfg, sup, engine: str) -> Check:
    info = inspect_engine(cfg, sup, engine)
    if "error" in info and "versions" not in info:
        return Check(f"engine-env:{engine}", FAIL, f"the {engine} environment cannot run the probe: {info['error']}",
                     f"fix engines.{engine} (python / command_prefix) or rebuild it (`make engine-env` on CPU)")
    versions = ", ".join(f"{k} {v}" for k, v in (info.get("versions") or {}).items())
    flags = info.get("serve_flags") or {}
    said = "; server flags " + ", ".join(f"{f} {'accepted' if ok else 'absent (not passed)'}"
                                          for f, ok in flags.items()) if flags else ""
    if "serve_flags_error" in info:  # asked only of an engine with optional_serve_flags
        return Check(f"engine-env:{engine}", FAIL, f"importable ({versions}), but its server's argument parser could "
                     f"not be read: {info['serve_flags_error']}", "use a vLLM build whose `vllm serve` parser "
                     "the probe can build (0.25 and 0.32 are known to work)")
    return Check(f"engine-env:{engine}", PASS, f"importable: {versions}{said}")


def uninspected_engine(engine: str) -> Check:
    return Check(f"engine-env:{engine}", WARN, f"the doctor has no in-engine probe for {engine} (engine_side/"
                 "inspect_target.py): its versions and its support for the target are first seen when its server "
                 "starts", f"add {engine} to engine_side/inspect_target.py to have them checked here")


def check_target_support(cfg, sup, engine: str) -> list[Check]:
    name = f"target-support:{engine}"
    try:
        config = target_config(cfg.target.model)
    except ConfigError as e:
        return [Check(name, FAIL, str(e), "restore the model's config.json")]
    if not config.get("architectures"):
        return [missing_architectures(name, cfg.target.model, config.get("model_type"))]  # before any engine probe
    info = inspect_engine(cfg, sup, engine)
    if "error" in info:
        return [Check(name, FAIL, f"could not inspect the target in {engine}: {info['error']}",
                      "check target.model and the engine environment")]
    archs = info.get("architectures") or []
    if not info.get("registered"):
        return [Check(name, FAIL, f"{engine} {info.get('engine_version', '?')} has no model class for {archs}",
                      "use an engine build that supports this architecture")]
    if not info.get("supports_eagle3"):
        return [Check(name, FAIL, f"{info.get('architecture')} does not implement EAGLE-3 hidden-state capture in "
                      f"{engine} {info.get('engine_version', '?')} (F1/F3: 'Model does not support EAGLE3 interface')",
                      "use an engine version whose model class implements it, or a different target; "
                      "patching site-packages is how the operator lost hours")]
    checks = [Check(name, PASS, f"{info.get('architecture')} supports EAGLE-3 capture in {engine} "
                                f"{info.get('engine_version', '?')}")]
    attr_name = f"target-config:{engine}"
    if info.get("missing_config_attributes"):
        checks.append(Check(attr_name, FAIL, "the engine's EAGLE-3 path reads "
                            f"{', '.join(info['missing_config_attributes'])} from the target config, which lacks it (F2)",
                            "add the attribute to the target's config.json with the right token id, or use a "
                            "build that reads the attribute this model defines"))
    elif info.get("multimodal") and not info.get("config_reads"):
        checks.append(Check(attr_name, WARN, "multimodal target: which config attributes the EAGLE-3 path reads "
                            "could not be determined; such errors are only found at load", ""))
    else:
        reads = info.get("config_reads") or []
        checks.append(Check(attr_name, PASS, f"config has what the EAGLE-3 path reads ({', '.join(reads) or 'nothing extra: text-only target'})"))
    return checks


# model_type -> the class name engines register for it, for the fix of a config without `architectures`.
KNOWN_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                       "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM"}


def missing_architectures(name: str, model_dir, model_type: str | None) -> Check:
    """A config.json without `architectures` (what a GGUF-to-HF conversion writes): every engine picks
    the model class from that field, so it fails at load with an empty list; say which file and what to add."""
    config = f"{model_dir}/config.json"
    guess = KNOWN_ARCHITECTURES.get(model_type or "")
    fix = (f'add "architectures": ["{guess}"] to {config} (model_type {model_type!r})' if guess else
           f'add "architectures": ["<ModelClass>"] to {config}, naming the model class of model_type {model_type!r}')
    return Check(name, FAIL, f"{config} has no `architectures` field (or an empty one): the serving "
                 "engine takes the model class from it and has none to load", f"{fix}; a model made by "
                 "`eagle3 make-model` has it")


def check_load_generator(cfg: PipelineConfig, sup: Supervisor) -> Check | None:
    """The benchmark's load generator imports in its engine's environment (SGLang's bench_serving needs
    HF datasets, which its server does not): else it fails only once the first benchmark server is up."""
    engine = cfg.bench.engine
    if getattr(cfg.engines, engine) is None:
        return None  # the config check already names the missing engines section
    adapter = engine_registry.get(engine)
    module, client = adapter.load_client_module, adapter.load_client
    if failed := import_errors(cfg, sup, engine, module).get(module):
        why, missing = failed
        return Check(f"load-generator:{engine}", FAIL, f"the benchmark's load generator (`{client}`) cannot run in "
                     f"engines.{engine}: importing {module} fails with {why}",
                     f"install the package that provides `{missing}` into engines.{engine}'s environment" if missing
                     else f"repair engines.{engine}'s environment until `python -c 'import {module}'` succeeds there")
    return Check(f"load-generator:{engine}", PASS, f"`{client}` imports in engines.{engine}")


def check_trainer(cfg: PipelineConfig, sup: Supervisor) -> Check | None:
    """speculators' loss and attention kernels against combinations known to fail with the installed torch."""
    if cfg.engines.speculators is None:
        return None
    versions = trainer_compat.trainer_versions(cfg, sup)
    if why := trainer_compat.conflict(cfg, versions):
        head, _, fix = why.partition(". Fix: ")
        return Check("trainer-kernels", FAIL, head, fix)
    chosen = trainer_compat.trainer_flags(cfg, versions)
    where = f"speculators {versions.get('speculators', '?')}, torch {versions.get('torch', '?')}"
    return Check("trainer-kernels", PASS, f"{where}: " + (" ".join(chosen) if chosen else "speculators' defaults")
                 + (" (a known-bad default avoided)" if trainer_compat.known_bad(versions) else ""))


# ---- static checks ----------------------------------------------------------------------------

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
    from .handoff.core import ports_for
    from .handoff.holders import Ownership, port_holders

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
    from .handoff.gpus import NvmlBackend

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
    """The hidden-state mode decision (eagle3/hs_mode.py): the offline estimate, the free space
    under run_dir and the choice; FAIL with both numbers when neither mode fits."""
    from .hs_mode import NoModeFits, decide_now

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
    from .bench.inputs import drafter_gate

    if cfg.bench.drafter is not None:
        drafter = {"path": str(cfg.bench.drafter), "source": "bench.drafter"}
    elif manifest := handover.trained_drafter(cfg, required=False):
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


# ---- entry point ------------------------------------------------------------------------------

def engine_check_groups(cfg: PipelineConfig, sup: Supervisor) -> list[list[tuple[Callable, tuple]]]:
    """The checks that ask the engines, in their own environments (seconds each; the answers are cached
    per run dir and per user, eagle3/engines/probe.py), grouped so that the checks of one group share a
    probe and no two groups do: groups may run at once."""
    groups: list[list[tuple[Callable, tuple]]] = []
    for engine in sorted({engine for _, _, engine in phase_table.servers(cfg)}):  # each serving phase's engine
        if getattr(cfg.engines, engine) is None:
            continue
        if engine_registry.get(engine).inspected:
            groups.append([(check_engine_env, (cfg, sup, engine)), (check_target_support, (cfg, sup, engine))])
        else:
            groups.append([(uninspected_engine, (engine,))])
    return groups + [[(check_load_generator, (cfg, sup))], [(check_trainer, (cfg, sup))]]


def engine_checks(cfg: PipelineConfig, sup: Supervisor) -> list[tuple[Callable, tuple]]:
    return [check for group in engine_check_groups(cfg, sup) for check in group]


def warm_engine_probes(cfg: PipelineConfig, at_once: bool = True) -> threading.Thread:
    """Ask the engines the preflight's questions now, in the background: `eagle3 run` does it while the
    run's Prefect server starts, so the preflight that follows reads cached answers instead of waiting for
    them. Each group of checks asks in a thread of its own, at once: each probe is an engine interpreter
    importing its engine (17-21 s each on the H200 machine, where one after another they held the first
    phase ~40 s), and is one busy core. Each thread has its own supervisor (the caller's is busy starting
    that server); errors are the preflight's to report, so none is raised here. The returned thread ends
    when every group has. `at_once=False`: one group after another, as before (bench/first_phase_bench.py)."""
    def ask(i: int) -> None:
        for fn, args in engine_check_groups(cfg, Supervisor(cfg.layout.state))[i]:
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - the preflight asks again and reports it
                log.debug("probe warm-up: %s: %s", fn.__name__, e)

    def ask_all() -> None:
        n = len(engine_check_groups(cfg, Supervisor(cfg.layout.state)))
        workers = [threading.Thread(target=ask, args=(i,), name=f"eagle3-probe-warmup-{i}", daemon=True)
                   for i in range(n)]
        for w in workers:
            w.start()
            if not at_once:
                w.join()
        for w in workers:
            w.join()

    thread = threading.Thread(target=ask_all, name="eagle3-probe-warmup", daemon=True)
    thread.start()
    return thread


def run_doctor(cfg: PipelineConfig, sup: Supervisor | None = None, engines: bool = True) -> list[Check]:
    sup = sup or Supervisor(cfg.layout.state)
    checks: list[Check] = []
    progress.emit(progress.Event("preflight", progress.START, message="doctor: GPUs, model files, ports, disk, "
                                 f"layers{', engine probes (seconds each)' if engines else ''}"))

    def timed(fn, *args):
        t0 = time.monotonic()
        result = fn(*args)
        items = result if isinstance(result, list) else [result] if result else []
        for c in items:
            c.seconds = round(time.monotonic() - t0, 2)
        checks.extend(items)

    timed(check_gpus, cfg)
    timed(check_model_files, cfg)
    timed(check_ports, cfg, sup)
    timed(check_shm, cfg)
    timed(check_tensor_parallel, cfg)
    timed(check_disk, cfg)
    timed(check_aux_layers, cfg)
    timed(check_network_exposure, cfg)
    for fn, args in engine_checks(cfg, sup) if engines else ():
        timed(fn, *args)
    timed(check_drafter, cfg)
    atomic_write_json(cfg.layout.doctor / "report.json", [asdict(c) for c in checks])
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, WARN, FAIL)}
    progress.emit(progress.Event("preflight", progress.END, ok=not counts[FAIL],
                                 message=", ".join(f"{n} {s}" for s, n in counts.items() if n)))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)
