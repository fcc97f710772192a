"""Run inside vLLM's environment (eagle3/engines/vllm.py's inspect_script): can this vLLM capture
EAGLE-3 hidden states from the target? See inspect_target.py for the command line.

Loads the model *class* from vLLM's registry and checks the SupportsEagle3 interface; for multimodal
targets finds (in the installed vLLM's own source) which config attribute its EAGLE path reads for
that architecture, and whether the target's config has it. With --serve-flag FLAG (repeatable), also
says whether this vLLM's own `vllm serve` argument parser accepts FLAG: flags that one release has and
another lacks are chosen from this.
"""

import ast
import inspect as pyinspect
import os

from inspect_target import first_supported, has_path, run  # beside this script: run by path, its dir is on sys.path

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


def inspect(cfg: dict, result: dict, flags: list[str]) -> dict:
    from vllm.model_executor.models.registry import ModelRegistry

    if flags:
        try:
            result["serve_flags"] = serve_flags(list(flags))
        except Exception as exc:  # reported; whoever needs a flag's answer refuses without one
            result["serve_flags_error"] = f"{type(exc).__name__}: {exc}"
    arch = first_supported(result["architectures"], set(ModelRegistry.get_supported_archs()))
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

        per_arch, default = eagle_attribute_reads(pyinspect.getsource(llm_base_proposer))
        path = per_arch.get(arch, default)
        if path:
            result["config_reads"].append(".".join(path))
            if not has_path(cfg, path):
                result["missing_config_attributes"].append(".".join(path))
        else:
            result["config_reads_unknown"] = True
    return result


if __name__ == "__main__":
    run(inspect)
