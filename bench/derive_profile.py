"""A variant of a committed profile for one device session's run: a lever to try, another GPU count.

The variant lives beside its base (so the base's relative paths hold), under a dot-name git ignores,
with a name and run dir of its own, so it never resumes or overwrites the base profile's run. Each
`--set dotted.key=VALUE` replaces one field (VALUE is read as YAML: 12288, 0.7, [3, 5], true). The
result is validated by the pack's own schema before it is written, and written atomically: a typo in
a key fails here, naming the field, not minutes later on the machine.

    python bench/derive_profile.py configs/h200-smollm2.yaml h200-smollm2-data12k \\
        --set datagen.max_samples=12288 --set train.epochs=4
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3 import safe_yaml  # noqa: E402
from eagle3.config.loading import parse_config, read_mapping  # noqa: E402
from eagle3.errors import ConfigError  # noqa: E402
from eagle3.fsio import atomic_write_text  # noqa: E402


def _assign(raw: dict, dotted: str, value: object) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for i, key in enumerate(parents):
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(parents[:i + 1])} is not a section of the base profile")
    node[leaf] = value


def derive(base: Path, name: str, sets: list[str]) -> Path:
    """Write BASE's dir/.NAME.yaml: BASE with name, run_dir and each `key=value` of `sets`; its path."""
    raw = read_mapping(base)
    if not isinstance(raw, dict):
        raise ConfigError(f"{base}: not a mapping")
    raw.update(name=name, run_dir=f"../runs/{name}")
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: write it as dotted.key=VALUE, e.g. datagen.max_samples=12288")
        _assign(raw, key, safe_yaml.load(text, f"--set {key}"))
    out = base.parent / f".{name}.yaml"
    # parse_config resolves paths in the mapping it is given: the file keeps the base's relative ones
    parse_config(copy.deepcopy(raw), base.resolve().parent, source=f"{out} (derived from {base})", check_files=False)
    atomic_write_text(out, f"# Derived from {base.name} by bench/derive_profile.py: {' '.join(sets) or 'name only'}\n"
                      + safe_yaml.dump(raw))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the committed profile, e.g. configs/h200-smollm2.yaml")
    ap.add_argument("name", help="the variant's name (its run dir is runs/NAME)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        print(derive(args.base, args.name, args.sets))
    except ConfigError as e:
        print(f"derive_profile: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
