"""The preflight checks that ask the engines, each in its own interpreter (engine_side/; the answers are
cached, eagle3/engines/probe.py), and their warm-up while `eagle3 run`'s Prefect server starts."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .. import phase_table
from ..config import PipelineConfig
from ..config.target_model import target_config
from .. import engine_registry
from ..engines import trainer_compat
from ..errors import ConfigError
from ..engines.probe import import_errors, inspect_engine
from ..process.services import Supervisor
from .check import FAIL, PASS, WARN, Check

log = logging.getLogger("eagle3.doctor")

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
    return Check(f"engine-env:{engine}", WARN, f"the doctor has no in-engine probe for {engine} (its Engine has no "
                 "inspect_script): its versions and its support for the target are first seen when its server "
                 "starts", f"give the {engine} engine an inspect_script (eagle3/engine_side/inspect_target.py says "
                 "what it answers) to have them checked here")


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


def engine_check_groups(cfg: PipelineConfig, sup: Supervisor) -> list[list[tuple[Callable, tuple]]]:
    """The checks that ask the engines, in their own environments (seconds each; the answers are cached
    per run dir and per user, eagle3/engines/probe.py), grouped so that the checks of one group share a
    probe and no two groups do: groups may run at once."""
    groups: list[list[tuple[Callable, tuple]]] = []
    for engine in sorted({engine for _, _, engine in phase_table.servers(cfg)}):  # each serving phase's engine
        if getattr(cfg.engines, engine) is None:
            continue
        if engine_registry.get(engine).inspect_script:
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
