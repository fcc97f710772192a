#!/usr/bin/env bash
# What a device command brings back of a step's RESULTS dir: its small files as OUT/rec.tgz, and the next
# few pieces of a drafter that came back (RESULTS/DRAFTER/model.safetensors.partNN, written by
# `gpu_e2e.sh drafter-out`) not sent before, once that drafter is whole (its sha256 written, the joined file
# gone). A command brings back at most 8 files of 16 MiB each, 64 MiB in all: 3 pieces of 15 MiB and the
# record. A missing RESULTS fails at once: on 2026-12-06 a `cd` that failed left the tar packing the whole
# checkout, 1.5 GB, for ~55 s of device time per command.
#
#   bash bench/gpu_fetch.sh /tmp/e2e "$OUT" [DRAFTER]   # DRAFTER: the pieces' folder in RESULTS (default drafter-qwen)
set -euo pipefail
RESULTS=${1:?usage: gpu_fetch.sh RESULTS OUT [DRAFTER]}
OUT=${2:?usage: gpu_fetch.sh RESULTS OUT [DRAFTER]}
DRAFTER=${3:-drafter-qwen}
[ -d "$RESULTS" ] || { echo "gpu_fetch: no $RESULTS on this machine (a fresh one? its /tmp went with the last)" >&2; exit 1; }
cd "$RESULTS"
tar czf "$OUT/rec.tgz" --exclude='*.part[0-9]*' --exclude=.sent .
marks=".sent/$DRAFTER"  # one folder of marks per drafter: two drafters' pieces share their names
mkdir -p "$marks"
sent=0
if [ -f "$DRAFTER/model.safetensors.sha256" ] && [ ! -e "$DRAFTER/model.safetensors" ]; then
  for piece in "$DRAFTER"/model.safetensors.part[0-9]*; do
    [ -f "$piece" ] && [ ! -e "$marks/${piece##*/}" ] && [ "$sent" -lt 3 ] || continue
    cp "$piece" "$OUT/" && touch "$marks/${piece##*/}" && sent=$((sent + 1))
  done
fi
echo "gpu_fetch: rec.tgz and $sent drafter pieces; $(ls "$marks" | wc -l) of $(ls "$DRAFTER"/model.safetensors.part[0-9]* 2>/dev/null | wc -l) sent in all"
