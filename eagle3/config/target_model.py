"""What the config reads of the target model itself: its layer count, and EAGLE-3's default aux layers."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError, echo
from ..inputfiles import MAX_JSON_BYTES, read_capped


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default aux layers (vLLM convention: the input of decoder layer k)."""
    return [2, num_layers // 2, num_layers - 3]


def num_hidden_layers(model_dir: Path) -> int:
    """The target's layer count from its config.json (0 if absent); ConfigError naming the file if
    the file is not a readable JSON object or the count is not an integer."""
    path = Path(model_dir) / "config.json"
    text = target_config(model_dir)
    text = text.get("text_config") or text
    if not isinstance(text, dict):
        raise ConfigError(f"target.model: {path}: text_config must be a JSON object, got {type(text).__name__}")
    value = text.get("num_hidden_layers", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"target.model: {path}: num_hidden_layers is {echo(value)}, not an integer")
    return value


def target_config(model_dir: Path) -> dict:
    """The target's config.json as a dict; ConfigError naming the file if it is not a readable JSON object."""
    return read_json_file(Path(model_dir) / "config.json", "target.model")


def read_json_file(path: Path, field: str) -> dict:
    """A model's config.json (the target's, a drafter's) as a dict; ConfigError naming `field` and the
    file if it is not a readable JSON object."""
    data = read_capped(path, MAX_JSON_BYTES, field)
    try:
        cfg = json.loads(data)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{field}: {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                          "restore the model's config.json") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{field}: {path} is not UTF-8 JSON (byte offset {e.start}); restore it") from None
    except RecursionError:
        raise ConfigError(f"{field}: {path} is nested too deeply to be a model config; restore it") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{field}: {path} must hold a JSON object (a Hugging Face model config), "
                          f"got {type(cfg).__name__}")
    return cfg

