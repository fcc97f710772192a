#!/bin/bash
# After the Qwen train phase: stop this session's own qwen-session script (PIDs 2146, 1408, started by us)
# before its handoff bench, and measure the new drafter's held-out acceptance in one k=3 slot instead.
D=1796645123
until ps -o cmd= --ppid 2146 | grep -q draft_vocab_coverage; do
  kill -0 2146 2>/dev/null || break; sleep 0.5
done
had_out=$(ps -o cmd= --ppid 2146 | grep -c drafter-out)
kill 2146 1408 2>/dev/null
echo "$(date +%T) stopped the session script (drafter-out already started: $had_out), left $((D - $(date +%s)))"
[ "$had_out" = 0 ] && (DRAFTER_RUN=/tmp/repo/runs/h200-qwen-coder DRAFTER_OUT=drafter-qwen bash /tmp/repo/bench/gpu_e2e.sh /tmp/e2e drafter-out > /tmp/e2e/drafter-out.log 2>&1 &)
DEADLINE=$D PROFILE=h200-qwen-coder KS=3 CONC=1 WINDOWS=1 BUDGET_S=$(( D + 45 - $(date +%s) )) bash /tmp/repo/bench/gpu_e2e.sh /tmp/e2e ksweep > /tmp/e2e/ksweep-self.out 2>&1
echo "$(date +%T) ksweep rc $?, left $((D - $(date +%s)))"
