#!/usr/bin/env bash
# Real SGLang (0.5.16) on the H200 test machine: SGLang itself, then the pack's phases on it
# (configs/h200-tiny-sglang.yaml). bench/gpu_sglang_deps.sh makes the pieces; docs/SGLANG.md says how
# they are sent and what each step showed.
#
#   bash bench/gpu_sglang.sh RESULTS setup    # install SGLang (STAGE/a..d) and the pack's wheels (STAGE/pack-deps)
#   bash bench/gpu_sglang.sh RESULTS serve    # SGLang alone: the target, then EAGLE3 with the fixture drafter
#                                             # exported for SGLang (which the pack's gate refuses: F7), then
#                                             # the unexported speculators checkpoint
#   bash bench/gpu_sglang.sh RESULTS datagen  # eagle3 datagen on SGLang, through the pack
#   bash bench/gpu_sglang.sh RESULTS gate     # eagle3 bench with that drafter: refused before any server (F7)
#   bash bench/gpu_sglang.sh RESULTS hang     # F5: a startup that never gets ready (SGLang's children
#                                             # stopped once its weights are loaded), through eagle3 datagen
#   bash bench/gpu_sglang.sh RESULTS e2e      # eagle3 run configs/h200-tiny-sglang-e2e.yaml (rerun: resumes)
#   bash bench/gpu_sglang.sh RESULTS vllm-bench  # that run's drafter benchmarked on vLLM, same prompts
#   bash bench/gpu_sglang.sh RESULTS compare  # RESULTS/compare.md: the two benchmarks side by side
#   bash bench/gpu_sglang.sh RESULTS collect  # RESULTS/run-files.tar.gz: the runs' small files
# (e2e and vllm-bench need vLLM too: bench/gpu_e2e.sh RESULTS setup first, as docs/GPU.md says.)
#
# Env: STAGE (default /tmp/stage), SGSITE (SGLang's site dir, /tmp/sgsite), SITE (the pack's, /tmp/e2e-site).
# Every step appends {"step", "rc", "seconds", ...} to RESULTS/events.jsonl and leaves its logs in RESULTS.
set -uo pipefail
RESULTS=${1:?usage: gpu_sglang.sh RESULTS setup|serve|datagen|gate|hang|e2e|vllm-bench|compare|collect}
STEP=${2:?usage: gpu_sglang.sh RESULTS setup|serve|datagen|gate|hang|e2e|vllm-bench|compare|collect}
REPO=$(cd "$(dirname "$0")/.." && pwd)
STAGE=${STAGE:-/tmp/stage}
SGSITE=${SGSITE:-/tmp/sgsite}
SITE=${SITE:-/tmp/e2e-site}
CONFIG=$REPO/configs/h200-tiny-sglang.yaml
FIXTURE=$REPO/tests/fixtures/eagle3-tiny
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_IS_FLASHINFER_AVAILABLE=false
stamp() { date -u +%FT%T.%3NZ; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
event() { printf '{"at": "%s", "step": "%s", %s}\n' "$(stamp)" "$STEP" "$1" >> "$RESULTS/events.jsonl"; }
gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
gpu_apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l; }
pack() { PYTHONPATH="$SITE/pack:$REPO" python3 -m eagle3.cli "$@"; }

setup() {
  rm -rf "$SGSITE" && mkdir -p "$SGSITE" "$SITE/pack" || return 1
  # sgl-kernel travels without flash_ops.abi3.so (1.1 GB, the FA3 attention backend, not used here):
  # a zip of the rest of its wheel, unpacked as pip would.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SGSITE" \
    "$STAGE"/b/*.whl "$STAGE"/b/deps/*.whl "$STAGE"/c/*.whl "$STAGE"/a/*.whl "$STAGE"/d/*.whl || return 1
  python3 -m zipfile -e "$STAGE"/a/sgl_kernel_slim.zip "$SGSITE" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE/pack" \
    "$STAGE"/pack-deps/*.whl || return 1
  # The config names vLLM's wrappers too (extraction, the side-by-side benchmark): they exist, and run
  # vLLM once bench/gpu_e2e.sh's setup has installed it.
  bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" wrappers || return 1
  mkdir -p "$REPO/.gpu-engine/sglang/bin"
  printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$SGSITE" > "$REPO/.gpu-engine/sglang/bin/python"
  chmod +x "$REPO/.gpu-engine/sglang/bin/python"
  rm -rf "$RESULTS/drafter-sglang"
  pack export-drafter "$FIXTURE/drafter-trained" "$RESULTS/drafter-sglang" --engine sglang > "$RESULTS/export.log" 2>&1
  echo "export-drafter rc $? (a FAIL is expected: the fixture was trained with speculators' norms)" >> "$RESULTS/export.log"
  {
    date -u; nproc; python3 -V
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
    PYTHONPATH="$SGSITE" python3 "$REPO/eagle3/engine_side/engine_versions.py" --dist sglang
  } > "$RESULTS/machine.txt" 2>&1
}

# SGLang alone, outside the pack: NAME ARGS... -> RESULTS/serve-NAME.log and one JSON line in serve.jsonl
raw_server() {
  local name=$1 t0 pid ready=false
  shift
  t0=$(date +%s.%N)
  PYTHONPATH="$SGSITE" python3 -m sglang.launch_server --model-path "$FIXTURE/target" --served-model-name tiny \
    --host 127.0.0.1 --port 30000 --dtype bfloat16 --attention-backend triton --sampling-backend pytorch \
    --mem-fraction-static 0.2 --disable-prefill-cuda-graph "$@" > "$RESULTS/serve-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    curl -sf http://127.0.0.1:30000/health > /dev/null && { ready=true; break; }
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.5
  done
  local ready_s
  ready_s=$(since "$t0")
  local answers='{"client": "not run: the server did not get ready"}'
  if $ready; then
    answers=$(PYTHONPATH="$SITE/pack:$REPO" python3 - "$REPO" <<'EOF'
import json, sys, time, urllib.request
from eagle3.engines.sglang import accept_length as sglang_accept_length
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/configs/prompts/tiny-prompts.jsonl")]
out = {}
def ask(row, max_tokens):
    body = json.dumps({"model": "tiny", "max_tokens": max_tokens, "temperature": 0,
                       "messages": [row["conversations"][0]]}).encode()
    req = urllib.request.Request("http://127.0.0.1:30000/v1/chat/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=60))
# The rows and lengths of docs/../gpu-vllm.md's vLLM figures for this drafter: trained rows 12-19 at 32
# tokens, then held-out rows 64-79 at 64; SGLang's accept length is an average since start, so read after each.
for label, picked, n in (("trained rows 12-19, 32 tokens", rows[12:20], 32), ("held-out rows 64-79, 64 tokens", rows[64:80], 64)):
    t = time.monotonic(); tokens = 0
    for row in picked:
        tokens += ask(row, n)["usage"]["completion_tokens"]
    out[label] = {"completion_tokens": tokens, "seconds": round(time.monotonic() - t, 3),
                  "avg_accept_length_since_start": sglang_accept_length("http://127.0.0.1:30000")}
out["first_answer"] = ask(rows[12], 32)["choices"][0]["message"]["content"][:160]
print(json.dumps(out))
EOF
) || answers='{"client": "failed"}'
  fi
  local t1 stopped_rc
  t1=$(date +%s.%N)
  kill -TERM "$pid" 2> /dev/null
  wait "$pid"
  stopped_rc=$?
  local stop_s
  stop_s=$(since "$t1")
  sleep 1
  printf '{"name": "%s", "ready": %s, "ready_s": %s, "exit": %s, "stop_s": %s, "gpu_mib_after": %s, "shm_after": "%s", "answers": %s}\n' \
    "$name" "$ready" "$ready_s" "$stopped_rc" "$stop_s" "$(gpu_mib)" "$(ls /dev/shm | tr '\n' ' ')" "$answers" \
    >> "$RESULTS/serve.jsonl"
}

serve() {  # SERVERS: which of the three (default all)
  local k=(--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
  for name in ${SERVERS:-base eagle3-exported eagle3-unexported}; do
    case $name in
      base) raw_server base ;;
      eagle3-exported) raw_server eagle3-exported "${k[@]}" --speculative-draft-model-path "$RESULTS/drafter-sglang" ;;
      eagle3-unexported) raw_server eagle3-unexported "${k[@]}" --speculative-draft-model-path "$FIXTURE/drafter-trained" ;;
    esac
  done
}

datagen() {
  pack datagen "$CONFIG" < /dev/null > "$RESULTS/datagen.log" 2>&1
}

gate() {
  # bench.drafter = the fixture (speculators layout): refused before any server (doctor, then the phase).
  derived gate "raw['bench']['drafter'] = '$FIXTURE/drafter-trained'"
  local before
  before=$(gpu_mib)
  pack bench "$RESULTS/gate.yaml" < /dev/null > "$RESULTS/gate.log" 2>&1
  local rc=$?
  echo "bench rc $rc; GPU MiB before $before, after $(gpu_mib); processes on the GPU: $(gpu_apps)" >> "$RESULTS/gate.log"
  return $rc
}

derived() {  # NAME EDITS [CONFIG]: CONFIG copied to RESULTS/NAME.yaml, paths absolute, its own run dir, EDITS applied
  python3 - "${3:-$CONFIG}" "$RESULTS/$1.yaml" "$1" "$2" <<'EOF'
import sys, yaml, pathlib
src, dst, name, edits = sys.argv[1:]
raw = yaml.safe_load(open(src)); base = pathlib.Path(src).parent
raw["run_dir"] = str((base / raw["run_dir"]).resolve()) + "-" + name
raw["target"]["model"] = str((base / raw["target"]["model"]).resolve())
for env in raw["engines"].values(): env["python"] = str((base / env["python"]).resolve())
for ph in ("datagen", "bench"):
    if raw[ph].get("prompts"): raw[ph]["prompts"] = str((base / raw[ph]["prompts"]).resolve())
exec(edits)  # the step's own edits, written in this script
yaml.safe_dump(raw, open(dst, "w"))
EOF
}

hang() {
  # F5 as it looked: once the weights are on the GPU, SGLang's children (scheduler, detokenizer, ...) are
  # stopped with SIGSTOP, so the server never gets ready and neither its log nor its GPU memory moves
  # again. The pack must declare it hung within hang_timeout_s (60 s here) plus a few seconds, tear it
  # down, prove the GPU free, and fail the phase as retryable (`eagle3 datagen` runs it once; a flow's
  # task retry or a rerun resumes it).
  # The server is found through the pack's own registry (its leader's PID is its process group).
  derived hang 'raw["datagen"]["server"]["hang_timeout_s"] = 60; raw["datagen"]["max_samples"] = 32'
  local run="$REPO/runs/h200-tiny-sglang-hang" log leader pid rc
  rm -rf "$run"
  pack datagen "$RESULTS/hang.yaml" < /dev/null > "$RESULTS/hang.log" 2>&1 &
  pid=$!
  log="$run/datagen/logs/sglang-server.log"
  for _ in $(seq 1 600); do grep -q "Load weight end" "$log" 2> /dev/null && break; sleep 0.5; done
  leader=$(python3 -c "import json, sys
e = json.load(open(sys.argv[1])); e = e.get('entries', e) if isinstance(e, dict) else e
print(next(x['pid'] for x in e if x['phase'] == 'datagen'))" "$run/state/services.json")
  local stopped=()
  for p in $(ps -o pid= -g "$leader"); do
    [ "$p" = "$leader" ] || { kill -STOP "$p" && stopped+=("$p"); }
  done
  echo "$(stamp) SIGSTOP to ${#stopped[@]} children of SGLang leader $leader (GPU $(gpu_mib) MiB)" >> "$RESULTS/hang-harness.log"
  wait "$pid"
  rc=$?
  echo "$(stamp) eagle3 datagen rc $rc; GPU $(gpu_mib) MiB; processes on the GPU: $(gpu_apps)" >> "$RESULTS/hang-harness.log"
  cp "$log" "$RESULTS/hang-server.log" 2> /dev/null
  return $rc
}

e2e() {  # the whole pipeline (rerun to resume: BUDGET_S bounds one command, SIGTERM as a scheduler would;
  # E2E_ARGS: more `eagle3 run` options, e.g. --no-doctor to train while the load generator is being repaired)
  # shellcheck disable=SC2086
  timeout -s TERM -k 150 "${BUDGET_S:-480}" env PYTHONPATH="$SITE/pack:$REPO" python3 -m eagle3.cli run \
    ${E2E_ARGS:-} "$REPO/configs/h200-tiny-sglang-e2e.yaml" < /dev/null >> "$RESULTS/e2e.log" 2>&1
}

collect() {  # RESULTS/run-files.tar.gz: the runs' small files (logs, manifests, reports, handoffs), not their data
  bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" run-files
}

vllm_bench() {  # the e2e run's drafter (its speculators checkpoint) on vLLM: same target, prompts, settings
  local manifest="$REPO/runs/h200-tiny-sglang-e2e/train/manifest.json"
  [ -f "$manifest" ] || { echo "no $manifest: run the e2e step first" >&2; return 2; }
  derived vllm-bench "import json
raw['bench']['engine'] = 'vllm'
raw['bench']['drafter'] = json.load(open('$manifest'))['source_checkpoint']
raw['bench']['server']['extra_args'] = ['--gpu-memory-utilization', '0.2']" "$REPO/configs/h200-tiny-sglang-e2e.yaml"
  pack bench "$RESULTS/vllm-bench.yaml" < /dev/null > "$RESULTS/vllm-bench.log" 2>&1
}

compare() {  # RESULTS/compare.md: both engines' benchmark tables side by side
  python3 - "$REPO/runs/h200-tiny-sglang-e2e/bench/results.json" \
    "$REPO/runs/h200-tiny-sglang-e2e-vllm-bench/bench/results.json" "$RESULTS/compare.md" <<'EOF'
import json, sys
rows = []
for engine, path in (("sglang", sys.argv[1]), ("vllm", sys.argv[2])):
    for r in json.load(open(path))["table"]:
        rows.append(f"| {engine} | {r['config']} | {r['concurrency']} | {r['output_tok_s']} | {r['speedup']} | "
                    f"{r['mean_tpot_ms']} | {r['acceptance_length']} | {r['per_position_pct']} |")
head = ["| engine | server | concurrency | output tok/s | vs baseline | TPOT ms | acceptance length | per position % |",
        "|---|---|---|---|---|---|---|---|"]
open(sys.argv[3], "w").write("\n".join(head + rows) + "\n")
print("\n".join(head + rows))
EOF
}

case $STEP in
  setup|serve|datagen|gate|hang|e2e|vllm-bench|compare|collect) ;;
  *) echo "usage: gpu_sglang.sh RESULTS setup|serve|datagen|gate|hang|e2e|vllm-bench|compare|collect" >&2; exit 2 ;;
esac
t0=$(date +%s.%N)
"${STEP//-/_}"
rc=$?
event "\"rc\": $rc, \"seconds\": $(since "$t0"), \"gpu_mib_after\": $(gpu_mib)"
exit $rc
