"""Run inside an engine environment: can it import these modules (a load generator, say)?

A module that is installed can still fail at import (SGLang 0.5.16's `sglang.bench_serving` imports HF
`datasets`, which a server alone does not need), so the module is imported, not looked up.
Usage: python import_check.py MODULE [MODULE ...] [--out FILE]; prints one JSON object
{"imports": {module: null or "ErrorType: message"}, "missing": {module: the top-level module that was not
found, or null}}, with "error" set when any import failed.
"""

import argparse
import importlib

from engine_versions import report  # beside this script: run by path, its dir is on sys.path


def check(modules: list[str]) -> dict:
    imports, missing = {}, {}
    for name in modules:
        try:
            importlib.import_module(name)
            imports[name] = None
        except BaseException as exc:  # noqa: BLE001 -- a module may sys.exit() or raise anything at import
            imports[name] = f"{type(exc).__name__}: {exc}"
            not_found = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
            missing[name] = not_found.split(".")[0] if not_found else None
    failed = [f"{name}: {why}" for name, why in imports.items() if why]
    # "error" keeps a failed answer out of the probe caches: installing the missing package fixes it.
    return {"imports": imports, "missing": missing, **({"error": "; ".join(failed)} if failed else {})}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--out")
    args = parser.parse_args()
    report(check(args.modules), args.out)
