"""The tiny Llama target of CPU rehearsals and tests: built once, deterministically, atomically.

The weights and tokenizer come from eagle3/engine_side/make_tiny_model.py, which needs torch and
transformers and therefore runs with the engine's interpreter, as a supervised one-shot command.
A stamp in the model dir records what built it (parameters, builder and corpus hashes), so a
changed builder or corpus triggers a rebuild instead of silently reusing an old model.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from . import engine_registry
from .config import TINY_CONFIG, EngineEnv, load_config
from .errors import ConfigError
from .built_dir import building, ensure_built, run_engine_builder
from .fsio import atomic_write_json, read_json

PACKAGE = Path(__file__).resolve().parent
BUILDER = PACKAGE / "engine_side" / "make_tiny_model.py"
CORPUS = PACKAGE / "data" / "tiny-corpus.txt"
STAMP = "eagle3-tiny-model.json"
REQUIRED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja")


@dataclass(frozen=True)
class TinyModelSpec:
    # 8 layers keep vLLM's default aux layers (2, L//2, L-3) = (2, 4, 5) distinct; with 4 layers
    # they collapse and an EAGLE-3 drafter gets the wrong fc input width (docs/FACTS.md §4).
    layers: int = 8
    hidden: int = 128
    ffn: int = 256
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 4096
    max_positions: int = 2048
    seed: int = 0
    constant: bool = False

    def argv(self) -> list[str]:
        argv = ["--layers", str(self.layers), "--hidden", str(self.hidden), "--ffn", str(self.ffn),
                "--heads", str(self.heads), "--kv-heads", str(self.kv_heads), "--vocab", str(self.vocab),
                "--max-positions", str(self.max_positions), "--seed", str(self.seed)]
        return argv + (["--constant"] if self.constant else [])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_stamp(spec: TinyModelSpec) -> dict:
    return {"builder": "eagle3.tinymodel", "spec": asdict(spec),
            "builder_sha256": _sha256(BUILDER), "corpus_sha256": _sha256(CORPUS)}


def is_current(path: Path, spec: TinyModelSpec = TinyModelSpec()) -> bool:
    path = Path(path)
    return all((path / f).is_file() for f in REQUIRED_FILES) and read_json(path / STAMP) == expected_stamp(spec)


def default_engine() -> EngineEnv:
    """The default engine's environment as the embedded tiny config names it (interpreter and offline env vars)."""
    engine = getattr(load_config(TINY_CONFIG, check_files=False).engines, engine_registry.DEFAULT)
    if engine is None:
        raise ConfigError(f"{TINY_CONFIG}: engines.{engine_registry.DEFAULT} is not set; the tiny-model builder runs "
                          "with it")
    return engine


def make_tiny_model(out_dir: Path, engine: EngineEnv, spec: TinyModelSpec = TinyModelSpec(),
                    timeout_s: float = 600.0) -> Path:
    """Build the model whole and rename it into place (eagle3/built_dir.py); replaces an existing
    `out_dir`. Returns the resolved path."""
    out_dir = Path(out_dir).resolve()
    with building(out_dir) as (staged, work):
        run_engine_builder("make-tiny-model", engine, BUILDER, ["--out", str(staged), "--corpus", str(CORPUS),
                                                                *spec.argv()], work, staged, REQUIRED_FILES, timeout_s)
        atomic_write_json(staged / STAMP, expected_stamp(spec))
    return out_dir


def ensure_tiny_model(path: Path, engine: EngineEnv | None = None, spec: TinyModelSpec = TinyModelSpec(),
                      force: bool = False, timeout_s: float = 600.0) -> Path:
    """Return `path`, building the model first if it is missing, incomplete or built differently."""
    return ensure_built(path, lambda p: is_current(p, spec),
                        lambda p: make_tiny_model(p, engine or default_engine(), spec, timeout_s), force)[0]
