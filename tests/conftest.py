"""Shared fixtures. Expensive things (the tiny model, vLLM servers) are built once per session."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "configs" / "tiny-cpu.yaml"
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"


def engine_available() -> bool:
    return ENGINE_PYTHON.exists()


requires_engine = pytest.mark.skipif(not engine_available(), reason="engine venv missing: run `make engine-env`")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama target the rehearsal config names (built once, deterministic)."""
    if not engine_available():
        pytest.skip("engine venv missing: run `make engine-env`")
    from eagle3.tinymodel import ensure_tiny_model

    return ensure_tiny_model(REPO / "models" / "tiny-llama")


def tiny_raw_config() -> dict:
    return yaml.safe_load(TINY_CONFIG.read_text())


@pytest.fixture
def make_config(tmp_path):
    """Write a variant of the tiny config into tmp_path and load it: make_config({"datagen": {...}})."""
    from eagle3.config import load_config

    def _make(overrides: dict | None = None, run_dir: Path | None = None, check_files: bool = True):
        raw = tiny_raw_config()
        _merge(raw, overrides or {})
        raw["run_dir"] = str(run_dir or tmp_path / "run")
        for key in ("model",):
            raw["target"][key] = str((TINY_CONFIG.parent / raw["target"][key]).resolve()) \
                if not os.path.isabs(raw["target"][key]) else raw["target"][key]
        for name, env in raw["engines"].items():
            if env and env.get("python") and not os.path.isabs(env["python"]):
                env["python"] = os.path.normpath(TINY_CONFIG.parent / env["python"])  # keep the venv symlink
        if not os.path.isabs(raw["datagen"]["prompts"]):
            raw["datagen"]["prompts"] = str((TINY_CONFIG.parent / raw["datagen"]["prompts"]).resolve())
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(raw))
        return load_config(path, check_files=check_files)

    return _make


def _merge(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
