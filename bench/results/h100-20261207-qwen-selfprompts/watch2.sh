#!/bin/bash
# The session script would give the train phase only (time left - 200 s) and kill it: stop the script (our
# PIDs 2146, 1408; extract goes on under its own timeout), then train with the time there is, then one k=3 slot.
D=1796645123
cd /tmp/repo
kill 2146 1408 2>/dev/null
echo "$(date +%T) stopped the session script, left $((D - $(date +%s)))"
cfg=/tmp/repo/configs/.h200-qwen-coder.yaml
echo "=== $(date +%T) eagle3 run $cfg --only train (watch2)" >> /tmp/e2e/run-qwen.log
timeout -s TERM -k 30 $(( D + 40 - $(date +%s) )) env PYTHONPATH=/tmp/e2e-site/pack:/tmp/repo python3 -m eagle3.cli run "$cfg" --only train --wait 300 < /dev/null >> /tmp/e2e/run-qwen.log 2>&1
rc=$?
printf '{"at": "%s", "step": "qwen-session", "config": "%s", "rc": %s}\n' "$(date -u +%FT%TZ)" "$cfg --only train" "$rc" >> /tmp/e2e/events.jsonl
echo "$(date +%T) train rc $rc, left $((D - $(date +%s)))"
(DRAFTER_RUN=/tmp/repo/runs/h200-qwen-coder DRAFTER_OUT=drafter-qwen bash /tmp/repo/bench/gpu_e2e.sh /tmp/e2e drafter-out > /tmp/e2e/drafter-out.log 2>&1 &)
if [ "$rc" = 0 ] && [ $(( D + 45 - $(date +%s) )) -gt 120 ]; then
  DEADLINE=$D PROFILE=h200-qwen-coder KS=3 CONC=1 WINDOWS=1 BUDGET_S=$(( D + 45 - $(date +%s) )) bash /tmp/repo/bench/gpu_e2e.sh /tmp/e2e ksweep > /tmp/e2e/ksweep-self.out 2>&1
  echo "$(date +%T) ksweep rc $?, left $((D - $(date +%s)))"
fi
printf '{"at": "%s", "step": "qwen-session", "ended": true, "note": "watch2"}\n' "$(date -u +%FT%TZ)" >> /tmp/e2e/events.jsonl
