import os

# The flags whose presence differs between the releases the pack meets (as the real parsers do).
RELEASE_FLAGS = {"0.32": ["--enable-scale-out"], "0.25": []}


def release() -> str:
    return os.environ.get("STANDIN_VLLM_RELEASE", "0.32")


def make_arg_parser(parser):
    for name in ("--host", "--port", "--served-model-name", "--max-model-len", "--dtype", "--tensor-parallel-size",
                 "--speculative-config", "--kv-transfer-config", "--api-key", "--gpu-memory-utilization"):
        parser.add_argument(name)
    for name in RELEASE_FLAGS[release()]:
        parser.add_argument(name, action="store_true")
    return parser
