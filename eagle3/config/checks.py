"""Rules beyond one field's type: those spanning sections (cross_checks), those that need the
filesystem (file_checks). A phase's own rules are methods of its settings model
(eagle3.config.types.PhaseSettings), called here for each phase of the table."""

from __future__ import annotations

import os

from .. import managed, phase_table
from ..errors import ConfigError, echo
from ..inputfiles import dir_problem, file_problem
from .fanout import fanout_checks
from .model import PipelineConfig
from .target_model import num_hidden_layers


def server_engines(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """(phase section, engine) of each phase that runs a server."""
    return [(phase, engine) for phase, _, engine in phase_table.servers(cfg)]


def environments(cfg: PipelineConfig) -> list[str]:
    """The config's `engines` sections: each registered engine's, then speculators'."""
    return list(type(cfg.engines).model_fields)


def cross_checks(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """Rules that span sections; each problem is (field path, message with the fix)."""
    problems: list[tuple[str, str]] = []
    seen: dict[int, str] = {}
    for where, port in ((f"{phase}.server.port", server.port) for phase, server, _ in phase_table.servers(cfg)):
        if port in seen:
            problems.append((where, f"port {port} is also used by {seen[port]}; give each server its own port"))
        seen[port] = where
    for phase, engine in server_engines(cfg):
        if getattr(cfg.engines, engine) is None:
            problems.append((f"engines.{engine}", f"phase '{phase}' uses engine '{engine}'; set engines.{engine}"))
    if cfg.gpus and cfg.target.tensor_parallel_size > len(cfg.gpus):
        problems.append(("target.tensor_parallel_size",
                         f"{cfg.target.tensor_parallel_size} exceeds the {len(cfg.gpus)} GPUs listed in 'gpus'"))
    if not cfg.gpus and cfg.target.tensor_parallel_size != 1:
        problems.append(("target.tensor_parallel_size", "a CPU rehearsal (empty 'gpus') supports only 1"))
    spans = cfg.target.tensor_parallel_size * cfg.target.data_parallel_size
    if cfg.gpus and cfg.target.data_parallel_size > 1 and spans > len(cfg.gpus):
        problems.append(("target.data_parallel_size", f"{cfg.target.data_parallel_size} copies of "
                         f"{cfg.target.tensor_parallel_size} GPU(s) each need {spans} GPUs, and 'gpus' lists "
                         f"{len(cfg.gpus)}: set it to at most {len(cfg.gpus) // cfg.target.tensor_parallel_size}"))
    problems += _managed_conflicts(cfg) + _bounds(cfg) + fanout_checks(cfg)
    for p in phase_table.table():
        section = cfg.section(p.name)
        if section is not None:
            problems += section.checks(cfg)
    return list(dict.fromkeys(problems))  # two phases may find the same problem (a shared engine)


def _managed_conflicts(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """What extra_args or an engine env would set a second time (eagle3/managed.py says why not)."""
    twice = "a second value silently wins or loses"
    problems = []
    for section, engine in server_engines(cfg):
        args = list(getattr(cfg, section).server.extra_args)
        for i, arg, owner in managed.flag_conflicts(args, managed.server_flag_table(engine, section), section):
            problems.append((f"{section}.server.extra_args[{i}]", f"{echo(arg)} is also set by the pack, from {owner}; "
                                                                 f"{twice}: remove it from extra_args"))
    for name in environments(cfg):
        env = getattr(cfg.engines, name)
        if env is not None:
            remote_ok = any(getattr(cfg, s).server.allow_remote for s, e in server_engines(cfg) if e == name)
            problems += [(f"engines.{name}.env.{var}", why) for var, why in managed.env_conflicts(
                name, env.env, remote_ok, env.compile_cache)]
    return problems


def _bounds(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """Values that bound one another. (Not here, as they are not contradictions: a hang timeout
    above the startup budget, a connect timeout above the per-read request timeout, max_tokens
    beyond max_model_len, which vLLM clamps.)"""
    problems = []
    h = cfg.handoff
    if h.deadline_s <= h.grace_s:
        problems.append(("handoff.deadline_s", f"{h.deadline_s:g} s is not more than handoff.grace_s ({h.grace_s:g} s): "
                         "ending the services may use the whole grace and leave no time to see the GPUs freed; "
                         "make deadline_s larger than grace_s"))
    if h.poll_interval_s >= h.deadline_s:
        problems.append(("handoff.poll_interval_s", f"{h.poll_interval_s:g} s is not less than handoff.deadline_s "
                         f"({h.deadline_s:g} s): the GPUs would be looked at once; make it smaller"))
    return problems


def remote_binds(cfg: PipelineConfig) -> list[str]:
    """One line per network exposure the config allows (allow_remote), for every run and the doctor to say."""
    lines = []
    for section, _ in server_engines(cfg):
        server = getattr(cfg, section).server
        if not managed.is_loopback(server.host):
            lines.append(f"{section}.server.host is {server.host}: the {section} server is reachable from the network "
                         f"(allowed by {section}.server.allow_remote){'' if server.api_key else ', without an api_key'}")
    for name in environments(cfg):
        env, var = getattr(cfg.engines, name), managed.remote_env(name)
        if env is not None and var in env.env and not managed.is_loopback(env.env[var]):
            lines.append(f"engines.{name}.env.{var} is {echo(env.env[var])}: {name}'s internal ports are reachable "
                         "from the network (allowed by allow_remote)")
    return lines


def file_checks(cfg: PipelineConfig, source: str) -> list[str]:
    """Checks that need the filesystem; run after the schema has accepted the shape."""
    problems = []
    model = cfg.target.model
    config_json = model / "config.json"
    if why := dir_problem(model):
        problems.append(f"{source}: target.model: {str(model)!r} {why}; point it at a Hugging Face model dir "
                        "(for the CPU rehearsal: `eagle3 make-tiny-model DIR`)")
    elif why := file_problem(config_json):
        problems.append(f"{source}: target.model: {str(model)!r} has no usable config.json ({config_json} {why}); "
                        "it must be a Hugging Face model dir")
    for name in environments(cfg):
        env = getattr(cfg.engines, name)
        if env is not None and env.python is not None and (
                why := file_problem(env.python) or (None if os.access(env.python, os.X_OK) else "is not executable")):
            problems.append(f"{source}: engines.{name}.python: {str(env.python)!r} {why}; it must be an executable "
                            "interpreter: build it with `make engine-env` or point it at the engine venv's bin/python")
    for where, path in (("handoff.shm_dir", cfg.handoff.shm_dir), ("handoff.dev_dir", cfg.handoff.dev_dir),
                        *((f"handoff.pycache_dirs[{i}]", p) for i, p in enumerate(cfg.handoff.pycache_dirs))):
        if os.path.lexists(path) and (why := dir_problem(path)):
            problems.append(f"{source}: {where}: {str(path)!r} {why}; it must be a directory")
    if not dir_problem(model) and not file_problem(config_json):
        try:
            num_hidden_layers(model)
        except ConfigError as e:  # a corrupt config.json is a finding to list, not a traceback
            problems.append(f"{source}: {e}")
    for p in phase_table.table():
        section = cfg.section(p.name)
        if section is not None:
            problems += [f"{source}: {field}: {msg}" for field, msg in section.file_checks(cfg)]
    return problems
