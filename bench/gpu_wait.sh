#!/usr/bin/env bash
# Waits for a step of bench/gpu_e2e.sh started in its own session (setsid, so it outlives the device
# command that started it: a 10-minute command limit then never stops a run mid-phase), up to SECONDS,
# printing its progress; then rebuilds the record so whatever ran so far comes back with this command.
#
#   BUDGET_S=3000 setsid nohup bash bench/gpu_e2e.sh RESULTS real > RESULTS/real.out 2>&1 < /dev/null &
#   bash bench/gpu_wait.sh RESULTS STEP SECONDS     # exit 0: the step ended (its rc in events.jsonl); 3: still running
set -uo pipefail
RESULTS=${1:?usage: gpu_wait.sh RESULTS STEP SECONDS}
STEP=${2:?usage: gpu_wait.sh RESULTS STEP SECONDS}
LIMIT=${3:?usage: gpu_wait.sh RESULTS STEP SECONDS}
REPO=$(cd "$(dirname "$0")/.." && pwd)
# A step ends with its run's event; `session` runs several and ends with its own.
PATTERN="\"step\": \"$STEP\", \"config\""
case "$STEP" in session|sweep-session|data-session|measure-session|qwen-session|rerun-session) PATTERN="\"step\": \"$STEP\", \"ended\"" ;; esac
ended() { grep -qs "$PATTERN" "$RESULTS/events.jsonl"; }
while ! ended && [ "$SECONDS" -lt "$LIMIT" ]; do
  sleep 10
  tail -n 200 "$(ls -t "$RESULTS"/run-*.log 2>/dev/null | head -n 1)" 2>/dev/null | grep -E '^[0-9:]{8} ' | tail -n 1
done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
bash "$REPO/bench/gpu_e2e.sh" "$RESULTS" record > /dev/null 2>&1
if ended; then grep "$PATTERN" "$RESULTS/events.jsonl" | tail -n 1; exit 0; fi
echo "still running after ${LIMIT} s"; exit 3
