#!/usr/bin/env bash
# Slims what every device command carries beside its piece, for the length of one GPU session. A command
# carries the working tree (tracked and untracked, not ignored files) and its piece in 64 MiB together; the
# tree was 46.5 MiB on 2026-12-07, so each piece could be 16 MiB and the Qwen session took 93 carries. The
# GPU steps read none of the raw records (bench/results/), the tests but tests/gpu/ (the handoff bench starts
# its CUDA service, and bench/run_on_gpu.sh runs those tests), or the shipped SmolLM2 drafter's weights (only
# `shipped_rerun` does, and a slimmed session sets SHIPPED_RUNS=0): `on` takes them out of the index and
# ignores them in .git/info/exclude, so they stay on disk here and do not travel; `off` puts both back. Cut the
# pieces after `on` (bench/gpu_carry.sh sizes them by the tree). While on, the files' removal from the index is
# staged, and a commit would delete them from the project: `on` installs a pre-commit hook that refuses any commit
# (where no hook of the user's is in the way), `off` removes it.
#
#   bash bench/gpu_slim.sh on | off | status
set -euo pipefail
cd "$(dirname "$0")/.."
PATHS=(bench/results tests configs/drafters/smollm2-135m-h200/model.safetensors.xz)
KEEP=(tests/gpu)  # under PATHS, and travels all the same
EXCLUDE=.git/info/exclude BEGIN='# gpu_slim: begin' END='# gpu_slim: end'
HOOK=$(git rev-parse --git-path hooks/pre-commit) MARK='# gpu_slim: refuses commits while slimmed'
slimmed() { grep -qxF "$BEGIN" "$EXCLUDE" 2> /dev/null; }
case ${1:?usage: gpu_slim.sh on|off|status} in
  on)
    slimmed && { echo "gpu_slim: already on"; exit 0; }
    # `off` resets these paths in the index: anything staged there now would be lost with it.
    git diff --cached --quiet -- "${PATHS[@]}" ||
      { echo "gpu_slim: staged changes under ${PATHS[*]}; commit them first" >&2; exit 1; }
    git rm -r -q --cached -- "${PATHS[@]}"
    git add -- "${KEEP[@]}"  # tracked again, so they travel; `off` resets them with the rest
    mkdir -p "$(dirname "$EXCLUDE")"
    { echo "$BEGIN"; for p in "${PATHS[@]}"; do [ "$p" = tests ] && echo "/tests/*" || echo "/$p"; done
      for p in "${KEEP[@]}"; do echo "!/$p/"; done; echo "$END"; } >> "$EXCLUDE"
    if [ -e "$HOOK" ] || [ -n "$(git config core.hooksPath)" ]; then
      echo "gpu_slim: a pre-commit hook of your own is in place, so no guard: never commit while on" >&2
    else
      mkdir -p "$(dirname "$HOOK")"
      printf '#!/bin/sh\n%s\necho "%s" >&2\nexit 1\n' "$MARK" \
        "gpu_slim is on: run bash bench/gpu_slim.sh off before committing" > "$HOOK" && chmod +x "$HOOK"
    fi
    echo "gpu_slim: on; cut the pieces now (bench/gpu_carry.sh), and run off before any commit" ;;
  off)
    slimmed || { echo "gpu_slim: already off"; exit 0; }
    git reset -q -- "${PATHS[@]}"
    sed -i "/^$BEGIN\$/,/^$END\$/d" "$EXCLUDE"
    grep -qxF "$MARK" "$HOOK" 2> /dev/null && rm -f "$HOOK"
    echo "gpu_slim: off; every file is tracked again" ;;
  status) slimmed && echo on || echo off ;;
  *) echo "usage: gpu_slim.sh on|off|status" >&2; exit 2 ;;
esac
