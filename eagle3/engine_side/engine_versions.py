"""Run inside an engine environment: the versions of the packages the pack's choices depend on.

Reads package metadata only (no torch import), so it answers in well under a second.
Usage: python engine_versions.py [--dist DIST ...] [--out FILE]; prints one JSON object
{"versions": {dist: version}} of the pack's shared dependencies and of each DIST (an engine's own packages).
"""

import argparse
import importlib.metadata as md
import json
import os

DISTRIBUTIONS = ("torch", "transformers", "speculators", "triton")


def versions(engine_dists=()) -> dict:
    found = {}
    for dist in (*engine_dists, *DISTRIBUTIONS):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return found


def report(obj: dict, out: str | None) -> None:
    """Print the answer, and write it to `out` whole or not at all (the pack reads that file)."""
    text = json.dumps(obj)
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dist", action="append", default=[])
    parser.add_argument("--out")
    args = parser.parse_args()
    report({"versions": versions(args.dist)}, args.out)
