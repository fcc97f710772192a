class _Llama:
    supports_eagle3 = True
    supports_multimodal = False


class ModelRegistry:
    @staticmethod
    def get_supported_archs():
        return ["LlamaForCausalLM"]

    @staticmethod
    def _try_load_model_cls(arch):
        return _Llama if arch == "LlamaForCausalLM" else None
