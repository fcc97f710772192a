"""What the pack sets itself, so that a config may not set it a second time: engine flags in
`*.server.extra_args` and `train.extra_args`, and variables in `engines.*.env`.

A second value does not fail: one of the two wins by argument order, and the pack then waits on a
port, asks for a model name or proves free GPUs that the engine never used (a server bound to the
port in extra_args while the pipeline waited on the configured one until its startup budget ran
out, then blamed the wrong process). Flags are matched the way the engines' argparse parsers read
them: `--flag value` and `--flag=value`, underscores for dashes (vLLM), dotted sub-keys
(`--speculative-config.method`, vLLM) and unambiguous abbreviations (`--por` for `--port`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from . import engine_registry
from .process.services import OWNER_ENV, SERVICE_ENV

FLAG_FILE = "every flag the pack sets (a flag file can hold --port, --host, ... where they cannot be checked)"

# flag spellings -> what the pack sets them from ("{s}" = the phase section), on every engine's server;
# each engine adds its own (Engine.managed_flags)
_SERVER_COMMON = {
    ("--host",): "{s}.server.host",
    ("--port",): "{s}.server.port",
    ("--served-model-name",): "target.served_name",
    ("--api-key",): "{s}.server.api_key",
    ("--dtype",): "target.dtype",
    ("--trust-remote-code", "--no-trust-remote-code"): "target.trust_remote_code",
    ("--config",): FLAG_FILE,
}
PHASE_SERVER_FLAGS = {"extract": {("--kv-transfer-config",): "the pack's hidden-state capture (extract phase)"}}

TRAIN_FLAGS = {
    ("--speculator-type",): "the pack (EAGLE-3 drafters only)",
    ("--verifier-name-or-path",): "target.model",
    ("--data-path", "--hidden-states-path"): "the extract phase's output",
    ("--save-path",): "run_dir (train/checkpoints)",
    ("--on-missing",): "the pack (a sample without hidden states is an error)",
    ("--vllm-endpoint",): "hidden_states.mode online (the co-scheduled extraction server)",
    ("--target-layer-ids",): "extract.aux_layer_ids",
    ("--epochs",): "train.epochs",
    ("--lr",): "train.lr",
    ("--total-seq-len",): "train.total_seq_len",
    ("--ttt-steps",): "train.num_speculative_tokens",
    ("--draft-vocab-size",): "train.draft_vocab_size",
    ("--hidden-states-dtype",): "extract.hidden_states_dtype",
    ("--dry-run",): "train.dry_run",
    ("--trust-remote-code",): "target.trust_remote_code",
    ("--loss-implementation",): "train.loss_implementation",
    ("--draft-attn-impl",): "train.draft_attn_impl",
}

_ANY_ENGINE_ENV = {
    "CUDA_VISIBLE_DEVICES": "gpus (each process the pack starts gets exactly those GPUs, which the handoff proves free)",
    "CUDA_DEVICE_ORDER": "gpus (the pack numbers GPUs in PCI bus order, as NVML does)",
    OWNER_ENV: "the run's own token (it marks each process it starts, to find them again)",
    SERVICE_ENV: "the run's own service ids (it marks each process it starts, to find them again)",
}


def _long_name(arg: str) -> str | None:
    """`--flag` as argparse would look it up: without `=value`, without a dotted sub-key, dashes for underscores."""
    if not arg.startswith("--") or arg == "--":
        return None
    return "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def _match(arg: str, spellings: tuple[str, ...]) -> bool:
    name = _long_name(arg)
    for flag in spellings:
        if flag.startswith("--"):
            # argparse expands an unambiguous prefix (allow_abbrev, on in both engines)
            if name is not None and (name == flag or (len(name) >= 4 and flag.startswith(name))):
                return True
        elif arg == flag or arg.startswith(flag + "="):
            return True
    return False


def flag_value(args: list[str], flag: str) -> str | None:
    """The value `args` gives `flag` (`--flag v` or `--flag=v`; the last one wins, as argparse does)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def flag_conflicts(args: list[str], table: dict[tuple[str, ...], str], section: str = "") -> list[tuple[int, str, str]]:
    """(index in args, the argument, what the pack sets it from) for each managed flag in `args`."""
    found = []
    for i, arg in enumerate(args):
        for spellings, owner in table.items():
            if _match(arg, spellings):
                found.append((i, arg, owner.format(s=section)))
                break
    return found


def server_flag_table(engine: str, section: str) -> dict[tuple[str, ...], str]:
    return {**_SERVER_COMMON, **engine_registry.get(engine).managed_flags, **PHASE_SERVER_FLAGS.get(section, {})}


def engine_env_table(name: str) -> dict[str, str]:
    """Variables the pack sets in the processes of `name` (an engine, or speculators), with their source."""
    return {**_ANY_ENGINE_ENV, **({} if name == "speculators" else engine_registry.get(name).managed_env)}


def remote_env(name: str) -> str | None:
    """The variable that binds `name`'s internal ports, if it has one."""
    return None if name == "speculators" else engine_registry.get(name).remote_env


def compile_cache_vars(name: str) -> tuple[str, ...]:
    """Variables the pack's compile cache sets in `name`'s servers (eagle3/engines/compile_cache.py)."""
    return () if name == "speculators" else tuple(engine_registry.get(name).compile_cache_env(Path(".")))


def env_conflicts(engine: str, env: dict[str, str], remote_allowed: bool,
                  compile_cache: bool = False) -> list[tuple[str, str]]:
    """(variable, why it may not be set, with the fix) for each variable the pack sets itself."""
    found = [(var, f"also set by the pack, from {owner}; a second value silently wins or loses: remove it")
             for var, owner in engine_env_table(engine).items() if var in env]
    if compile_cache:
        found += [(var, f"also set by the pack's compile cache (engines.{engine}.compile_cache); a second value "
                        f"silently wins or loses: remove it, or set engines.{engine}.compile_cache: false to manage "
                        "the engine's caches yourself")
                  for var in compile_cache_vars(engine) if var in env]
    var = remote_env(engine)
    if var in env and not remote_allowed and not is_loopback(env[var]):
        found.append((var, "a non-loopback address exposes the engine's internal ports to the network; use 127.0.0.1, "
                           "or set allow_remote: true on the server of a phase that runs this engine"))
    return found


def is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
