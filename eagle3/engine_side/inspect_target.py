"""Run inside an engine's environment, by that engine's own inspect script (its Engine's inspect_script):
the part of the answer every engine shares, and the command line.

The answer says, without loading weights, whether this engine can serve and capture EAGLE-3 hidden
states from the target: the engine's script resolves the target's architecture (config.json) in the
engine's own model registry. Prints one JSON object; an error becomes {"error": ...} and exit 1.
Usage: python inspect_ENGINE.py MODEL_DIR [--dist DIST ...] [--serve-flag FLAG ...] [--out FILE]
  --dist: the engine's own packages (its Engine's distributions); the first one installed is its version.
"""

import argparse
import json
import os
import sys

from engine_versions import report as write_report, versions  # beside this script: run by path, its dir is on sys.path


def run(inspect) -> None:
    """Answer with inspect(target_config, result, serve_flags) -> result, where `result` already has the
    target's architectures, the packages' versions and the engine's version."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--dist", action="append", default=[])
    parser.add_argument("--serve-flag", action="append", default=[])
    parser.add_argument("--out")
    args = parser.parse_args()
    found = versions(args.dist)
    try:
        with open(os.path.join(args.model_dir, "config.json")) as fh:
            cfg = json.load(fh)
        result = {"architectures": cfg.get("architectures") or [], "model_type": cfg.get("model_type"),
                  "versions": found, "engine_version": next((found[d] for d in args.dist if d in found), "?")}
        report, code = inspect(cfg, result, args.serve_flag), 0
    except Exception as exc:  # report, don't traceback: the caller turns this into a FAIL line
        report, code = {"error": f"{type(exc).__name__}: {exc}", "versions": found}, 1
    write_report(report, args.out)
    sys.exit(code)


def first_supported(archs: list[str], supported) -> str | None:
    """The first of the target's architectures the engine's registry has."""
    return next((a for a in archs if a in supported), None)


def has_path(cfg: dict, path: list[str]) -> bool:
    node = cfg
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
