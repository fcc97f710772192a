"""The serving engines the pack knows, by name. Each entry names its module's ENGINE object as
"module:ATTRIBUTE", imported only when asked for, so that the config (which validates engine names
and builds its `engines` section from this list) imports no engine module.

Adding an engine is one module (a subclass of eagle3.engines.engine.Engine, instance ENGINE) plus one
entry here; the config's engine choices, its `engines.<name>` section, the managed-flag checks and the
docs' lists follow from it. Tests and plugins add one without editing this file:
  - in process: `with using({"name": "module:ENGINE"}): ...`
  - across processes (`eagle3 run` in a subprocess, a Prefect worker's flow-run processes):
    EAGLE3_ENGINES=name=module:ENGINE[,name2=...]
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from typing import Iterator

from .errors import ConfigError

ENGINES_ENV = "EAGLE3_ENGINES"
BUILTIN = {"vllm": "eagle3.engines.vllm:ENGINE", "sglang": "eagle3.engines.sglang:ENGINE"}
DEFAULT = "vllm"  # the engine of a config section that names none, and of a record from before records named it
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_swapped: list[dict[str, str]] = []


def entries() -> dict[str, str]:
    """name -> "module:ATTRIBUTE": the built-in engines, then EAGLE3_ENGINES's, then in-process additions."""
    out = dict(BUILTIN)
    for item in filter(None, (s.strip() for s in os.environ.get(ENGINES_ENV, "").split(","))):
        name, sep, ref = item.partition("=")
        if not sep or not _NAME.match(name) or ":" not in ref:
            raise ConfigError(f"{ENGINES_ENV}: {item!r} is not name=module:ATTRIBUTE")
        out[name] = ref
    for extra in _swapped:
        out.update(extra)
    return out


def names() -> tuple[str, ...]:
    return tuple(entries())


def get(name: str):
    """The Engine object registered as `name` (eagle3.engines.engine.Engine)."""
    ref = entries().get(name)
    if ref is None:
        raise ConfigError(f"unknown engine {name!r}; the pack knows {', '.join(names())}")
    module, _, attr = ref.partition(":")
    try:
        engine = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        where = f"{ENGINES_ENV}" if name not in BUILTIN else "the pack's engine registry"
        raise ConfigError(f"engine {name!r} is {ref} ({where}), which cannot be loaded: {type(e).__name__}: {e}; "
                          f"make that module importable (PYTHONPATH) or fix {where}") from None
    if engine.name != name:
        raise ConfigError(f"engine {name!r} names {ref}, whose name is {engine.name!r}")
    return engine


@contextlib.contextmanager
def using(extra: dict[str, str]) -> Iterator[None]:
    """Run the block with more engines registered (a test's stand-in, a plugin)."""
    bad = [n for n in extra if not _NAME.match(n) or n == "speculators"]
    if bad:
        raise ConfigError(f"engine names must match {_NAME.pattern} and not be 'speculators': {bad}")
    added = dict(extra)
    _swapped.append(added)
    try:
        yield
    finally:
        _swapped.remove(added)
