"""Helpers of the reliability suite: a fake engine venv whose console scripts are the stand-in engine
(tests/reliability/standin_engine.py), configs that point the pack at it, and process checks.

The pack launches the stand-ins through its own code (Supervisor, serving.start_server, the phases),
so what is tested is the pack's real launch, readiness, retry, stop and handoff paths; only the
engine at the other end is a small stdlib program instead of vLLM."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from eagle3.process import procfs
from eagle3.phase_table import TABLE_ENV
from tests.conftest import write_tiny_config
from tests.ports import free_port

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin_engine.py"
STANDIN_VLLM = HERE / "standin_vllm"  # what the engine probe imports (vLLM's serve parser, its registry)
SCRIPTS = ("vllm", "speculators", "torchrun")


def fake_engine_venv(directory: Path) -> Path:
    """directory/bin/{python, vllm, speculators, torchrun}; returns the python path for engines.*.python.
    `python` is this interpreter (a symlink, as in a real venv); the scripts are the stand-in."""
    bin_dir = Path(directory) / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    for name in SCRIPTS:  # the stand-in runs in the script's process with argv as given (argv[0]: the script)
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\nsource = {str(STANDIN)!r}\n"
                          "exec(compile(open(source).read(), source, 'exec'), {'__name__': '__main__', '__file__': source})\n")
        script.chmod(0o755)
    return python


def stub_model(directory: Path, layers: int = 8, hidden: int = 128) -> Path:
    """A model dir that passes the config's file checks (config.json only; the stand-ins load nothing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                       "num_hidden_layers": layers, "hidden_size": hidden}))
    return directory


def standin_config(tmp_path: Path, env: dict | None = None, overrides: dict | None = None,
                   run_dir: Path | None = None, name: str = "standin"):
    """The tiny config with every engine replaced by the stand-in (engines.*.env += `env`), a stub
    model, free ports and short timeouts; written to tmp_path/config.yaml and loaded."""
    python = fake_engine_venv(tmp_path / "engine-venv")
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDIN_VLLM), env.get("PYTHONPATH", "")) if p)
    engine = {"python": str(python), "env": env}
    raw = {"name": name,
           "target": {"model": str(stub_model(tmp_path / "model"))},
           "engines": {"vllm": engine, "speculators": engine},
           "datagen": {"server": {"port": free_port(), "startup_timeout_s": 30, "hang_timeout_s": 30,
                                  "stop_grace_s": 2}},
           "extract": {"server": {"port": free_port(), "startup_timeout_s": 30, "hang_timeout_s": 30,
                                  "stop_grace_s": 2}},
           "bench": {"server": {"port": free_port(), "stop_grace_s": 2}},
           "handoff": {"grace_s": 2, "deadline_s": 10}}
    _merge(raw, overrides or {})
    return write_tiny_config(tmp_path, raw, run_dir=run_dir)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []


def live(pid: int, start_ticks: int | None) -> bool:
    """Is this exact process (PID + start time) still alive and not a zombie?"""
    info = procfs.read_stat(pid)
    return info is not None and not info.zombie and (start_ticks is None or info.start_ticks == start_ticks)


def _merge(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def pythonpath_with(*dirs: Path) -> str:
    return os.pathsep.join([*map(str, dirs), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)


def write_extract_inputs(cfg, n: int = 6, seq: int = 20, layers: int = 4, hidden: int = 128):
    """Phase 1's output and a finished prepare-data step (prepared/ with the token ids the stand-in
    writer uses, and the index the phase checks hs files against), so `run_extract` goes straight to
    generating hidden states. Returns (PreparedIndex, Expect) for eagle3.phases.hs_files.scan_dir."""
    from eagle3.phases.extract import ExtractPaths
    from eagle3.phases.hs_files import Expect, PreparedIndex
    from tests.reliability.standin_engine import ids_digest

    samples = cfg.layout.samples
    samples.parent.mkdir(parents=True, exist_ok=True)
    turns = [{"role": "user", "content": "Explain a mutex."}, {"role": "assistant", "content": "A lock."}]
    samples.write_text("".join(json.dumps({"id": f"x{i}", "conversations": turns,
                                           "meta": {"prompt_tokens": seq // 2, "completion_tokens": seq - seq // 2}})
                               + "\n" for i in range(n)))
    paths = ExtractPaths.of(cfg)
    paths.prepared.mkdir(parents=True)
    ids = [[1000 * i + j for j in range(seq)] for i in range(n)]
    (paths.prepared / "ids.json").write_text(json.dumps({"ids": ids, "layers": layers, "hidden": hidden}))
    index = {"num_samples": n, "total_tokens": n * seq, "seq_len": [seq] * n,
             "ids_sha256": [ids_digest(x) for x in ids]}
    paths.index.write_text(json.dumps(index))
    mark_done(cfg, "datagen")
    return PreparedIndex.from_dict(index), Expect(layers, hidden, "float32")


def mark_done(cfg, phase: str) -> None:
    """Record `phase` done over the output already in its dir (through run_phase, with a function
    that only reports it), so a phase command's upstream check passes as after a real run."""
    from eagle3 import phase_table
    from eagle3.phase_runner import run_phase

    with phase_table.using(phase_table.with_runs({phase: f"{__name__}:{_report_output.__name__}"})):
        run_phase(cfg, phase)


def _report_output(cfg, sup):
    from eagle3.phases import PhaseSummary

    return PhaseSummary(str(cfg.run_dir), "output written by the test", {})


def eagle3_run_env(home: Path, table: str | None = None) -> dict:
    from tests.flows.flowkit import base_env

    env = base_env() | {"PREFECT_HOME": str(home), "PYTHONPATH": pythonpath_with(HERE)}
    if table:  # module:ATTRIBUTE of a phase table in this folder
        env[TABLE_ENV] = table
    return env


def assert_nothing_left(home: Path) -> None:
    from tests.flows.flowkit import processes_with_home

    time.sleep(1)
    left = [(p.pid, " ".join(procfs.cmdline(p.pid))[:200]) for p in processes_with_home(home)]
    assert not left, f"processes of the run outlived `eagle3 run`: {left}"
