"""Reading a config: bounded parsing, relative paths resolved against the config file's directory
(so a config means the same thing whatever the caller's working directory is), every problem
listed at once with the field and the fix."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import ValidationError

from .. import owned, phase_table, safe_yaml
from ..errors import ConfigError, echo
from ..inputfiles import decode_utf8, read_capped
from .checks import cross_checks, file_checks
from .dirs import owned_dir_problem
from .model import PipelineConfig, config_model


PINNED = "eagle3_pinned_config"  # the header key of a run's pinned copy of its config

# Path fields of the sections every pipeline has; a phase's own are its settings' PATH_FIELDS.
_PATH_FIELDS = ("run_dir", "target.model", "engines.*.python", "handoff.shm_dir", "handoff.dev_dir",
                "handoff.pycache_dirs[]")


def path_fields() -> tuple[str, ...]:
    phases = [f"{p.name}.{field}" for p in phase_table.table() if (model := p.settings_model()) is not None
              for field in model.PATH_FIELDS]
    return (*_PATH_FIELDS, *phases)


def _resolve_paths(raw: dict, base: Path) -> dict:
    def fix(value):
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            # normpath, not resolve(): a venv's bin/python is a symlink to the base interpreter, and
            # following it would lose the venv (its site-packages and its console scripts).
            return os.path.normpath(base / value)
        if isinstance(value, str):
            return os.path.expanduser(value)
        return value

    def walk(node, parts):
        if not isinstance(node, dict) or not parts:
            return
        head, rest = parts[0], parts[1:]
        keys = list(node) if head == "*" else [head.rstrip("[]")]
        for key in keys:
            if key not in node:
                continue
            if rest:
                walk(node[key], rest)
            elif head.endswith("[]") and isinstance(node[key], list):
                node[key] = [fix(v) for v in node[key]]
            else:
                node[key] = fix(node[key])

    for spec in path_fields():
        walk(raw, spec.split("."))
    return raw


MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; the cap also bounds the parsing time (< 1 s)
MAX_STRING_CHARS = 1 << 16  # a command-line argument holds at most 128 KiB (Linux MAX_ARG_STRLEN)
MAX_LISTED = 40             # problems listed in one message; the rest are counted
MAX_LINE_CHARS = 2000
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping",
          type(None): "null"}
_PATTERN_HINTS = {
    "host": "must be a hostname or an IPv4 address such as 127.0.0.1 (no scheme, port or IPv6 literal)",
    "[key]": "an environment variable name must be letters, digits and underscores, not starting with a digit",
}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "constrained-")):
            continue
        else:
            out += ("." if out else "") + echo(str(part), 60, quote=False)
    return out or "(top level)"


def _format_errors(err: ValidationError, source: str) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        loc = _loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling (see the config reference in docs/config.md)"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        elif e["type"] == "string_pattern_mismatch":
            msg = next((hint for end, hint in _PATTERN_HINTS.items() if loc.endswith(end)), msg)
        lines.append(f"{source}: {loc}: {msg}{_shown(e, loc)}")
    return lines


def _shown(e: dict, loc: str) -> str:
    """What was given, as far as a message may echo it: never a secret, never more than a line."""
    got = e.get("input")
    if e["type"] in ("missing", "model_attributes_type") or isinstance(got, dict) or "api_key" in loc:
        return ""
    booleans = isinstance(got, bool) and e["type"] != "bool_type"
    hint = "; YAML reads true/false/yes/no/on/off as booleans" if booleans else ""
    return f" (got {echo(got)}, {_kind(got)}{hint})"


def _raw_problems(raw: dict) -> list[str]:
    """Text no destination can carry, whatever field it is in: a NUL (argv, environment and paths
    end at it) and strings beyond what one command-line argument may hold."""
    problems, stack = [], [(raw, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                problems.append(f"{where or '(top level)'}: contains a NUL character, which no command line, "
                                "environment variable or path can carry; remove it")
            if len(value) > MAX_STRING_CHARS:
                problems.append(f"{where or '(top level)'}: a string of {len(value)} characters, more than the "
                                f"{MAX_STRING_CHARS} allowed (an engine argument can hold at most 128 KiB)")
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                inner = (where + "." if where else "") + echo(str(key), 60, quote=False)
                stack.append((item, inner))
                if isinstance(key, str):
                    stack.append((key, f"{inner} (the key)"))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in reversed(list(enumerate(value))))
    return problems


def _listing(lines: list[str]) -> str:
    shown = [line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..." for line in lines[:MAX_LISTED]]
    more = [f"... and {len(lines) - MAX_LISTED} more problems"] if len(lines) > MAX_LISTED else []
    return "\n".join(shown + more)


def parse_config(raw: object, base_dir: Path, source: str = "config", check_files: bool = True) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (name:, run_dir:, target:, ...), "
                          f"got {_kind(raw)}")
    problems = [f"{source}: {p}" for p in _raw_problems(raw)]
    try:
        cfg = config_model().model_validate(_resolve_paths(dict(raw), base_dir))
    except ValidationError as err:
        raise ConfigError(_listing(problems + _format_errors(err, source))) from None
    problems += [f"{source}: {field}: {msg}" for field, msg in cross_checks(cfg)]
    if why := owned_dir_problem(cfg.run_dir, writable=check_files):
        problems.append(f"{source}: run_dir: {why}")
    elif why := owned.ancestor_problem(cfg.run_dir) or owned.owner_problem(cfg.run_dir):
        problems.append(f"{source}: run_dir: {cfg.run_dir}: {why}")
    if check_files:
        problems += file_checks(cfg, source)
    if problems:
        raise ConfigError(_listing(problems))
    return cfg


# Every config this process validated, by the bytes it was read from, the directory its relative paths
# resolve against and the schema it was validated by (the phase table's and the engines' model): a run
# validates its config once, at its entry point, and the pinned copy it writes is registered with the
# same model, so its flow, tasks, handoffs and retries in this process get that model back after reading
# the file and matching its sha256, never a validation of their own. The models are frozen; a file whose
# bytes changed, or a schema that changed (a test's own phase table or engine), is validated anew.
_validated: dict[tuple, PipelineConfig] = {}


def _key(path: Path, data: bytes, check_files: bool) -> tuple:
    return str(path.resolve().parent), hashlib.sha256(data).hexdigest(), check_files, config_model()


def remember(path: Path, data: bytes, cfg: PipelineConfig, check_files: bool) -> None:
    """`cfg` is what the file at `path` holding `data` validates to (a pinned copy just written)."""
    _validated[_key(path, data, check_files)] = cfg


def load_config(path: Path | str, check_files: bool = True) -> PipelineConfig:
    """Read, parse and validate a config file completely; ConfigError listing every problem. Bounded
    in time and memory whatever the file holds (see safe_yaml and inputfiles). Bytes this process
    already validated give the same model back (a validation with file checks serves one without)."""
    path = Path(path)
    return validated(path, read_config_bytes(path), check_files)


def read_config_bytes(path: Path) -> bytes:
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: config file not found")
    return read_capped(path, MAX_CONFIG_BYTES, "config file")


def validated(path: Path, data: bytes, check_files: bool = True) -> PipelineConfig:
    """The model of the config file at `path` read as `data` (load_config, for a caller that needs the
    bytes it validated too: what it pins is then what was validated)."""
    for checked in (check_files, True):
        if (cfg := _validated.get(_key(path, data, checked))) is not None:
            return cfg
    raw = parse_mapping(data, path)
    if isinstance(raw, dict) and PINNED in raw:  # a run's pinned copy (eagle3.config.pinned): read the same way
        header, body = raw[PINNED], raw.get("config")
        source = f"{path} (pinned from {header.get('source') if isinstance(header, dict) else '?'})"
        cfg = parse_config(body, path.resolve().parent, source=source, check_files=check_files)
    else:
        cfg = parse_config(raw, path.resolve().parent, source=str(path), check_files=check_files)
    remember(path, data, cfg, check_files)
    return cfg


def read_mapping(path: Path) -> object:
    """A config file's YAML, parsed (bounded), not yet validated."""
    return parse_mapping(read_capped(path, MAX_CONFIG_BYTES, "config file"), path)


def parse_mapping(data: bytes, path: Path) -> object:
    text = decode_utf8(data, str(path))
    raw = safe_yaml.load(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (or holds only comments); start from configs/smollm2-cpu.yaml (CPU) or configs/h200-smollm2.yaml (one GPU)")
    return raw


def resolved_mapping(raw: dict, base_dir: Path) -> dict:
    """The mapping with every path field made absolute against base_dir: what a pinned copy holds."""
    return _resolve_paths(dict(raw), base_dir)


DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-cpu.yaml"  # `make demo`: the real model
TINY_CONFIG = DEFAULT_CONFIG.with_name("tiny-cpu.yaml")  # the random-weight target the tests rehearse on