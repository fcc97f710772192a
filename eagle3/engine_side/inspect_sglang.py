"""Run inside SGLang's environment (eagle3/engines/sglang.py's inspect_script): can this SGLang serve
the target and capture its EAGLE-3 hidden states? See inspect_target.py for the command line."""

from inspect_target import first_supported, run  # beside this script: run by path, its dir is on sys.path


def inspect(cfg: dict, result: dict, flags: list[str]) -> dict:
    # SGLang's EAGLE-3 capture hook is a method on the model class (not run on CPU machines).
    from sglang.srt.models.registry import ModelRegistry

    arch = first_supported(result["architectures"], set(ModelRegistry.get_supported_archs()))
    result.update(architecture=arch, registered=arch is not None)
    if arch is not None:
        cls, _ = ModelRegistry.resolve_model_cls([arch])
        result["class"] = f"{cls.__module__}.{cls.__qualname__}"
        result["supports_eagle3"] = hasattr(cls, "set_eagle3_layers_to_capture")
        result["multimodal"], result["config_reads"], result["missing_config_attributes"] = False, [], []
    return result


if __name__ == "__main__":
    run(inspect)
