"""One strict pydantic schema for the whole pipeline, validated completely before anything starts.

  types.py         the strict base, value types, the sections every pipeline has, PhaseSettings
  model.py         PipelineConfig and config_model(): one section per row of the phase table
  checks.py        rules spanning sections, and those that need the filesystem
  loading.py       load_config / parse_config: bounded parsing, relative paths, every problem at once
  dirs.py          where the pipeline may write
  target_model.py  what the config reads of the target model (layer count, default aux layers)
"""

from .checks import cross_checks, remote_binds, server_engines
from .dirs import CHECKOUT, owned_dir_problem
from .loading import DEFAULT_CONFIG, MAX_CONFIG_BYTES, TINY_CONFIG, MAX_STRING_CHARS, load_config, parse_config
from .model import PipelineConfig, config_model
from .target_model import default_aux_layer_ids, num_hidden_layers
from .types import (PROTECTED_PROCESS_NAMES, EngineEnv, Engines, FsPath, Handoff, HiddenStates, PhaseSettings, Port, PositiveFloat, Server, Strict, Target, non_finite)

__all__ = ["CHECKOUT", "DEFAULT_CONFIG", "TINY_CONFIG", "MAX_CONFIG_BYTES", "MAX_STRING_CHARS", "PROTECTED_PROCESS_NAMES",
           "EngineEnv", "Engines", "FsPath", "Handoff", "HiddenStates", "PhaseSettings",
           "PipelineConfig", "Port", "PositiveFloat", "Server", "Strict", "Target", "config_model", "cross_checks",
           "default_aux_layer_ids", "load_config", "non_finite", "num_hidden_layers", "owned_dir_problem",
           "parse_config", "remote_binds", "server_engines"]
