#!/usr/bin/env bash
# One carried piece into place on the GPU machine, from a command that may be the first the machine runs:
# it makes DIR itself and renames the piece in only once copied, so a step waiting for pieces never reads a
# half-written one. On 2026-12-06 19:50 the first command of a session (the only one that made /tmp/stage)
# was refused while the machine started; every later piece failed and ~15 min of device time went by.
#
#   bash bench/gpu_put.sh .carry/bundle/piece00 /tmp/stage [NAME]   # -> /tmp/stage/NAME (default: the file's name)
set -euo pipefail
SRC=${1:?usage: gpu_put.sh PIECE DIR [NAME]}
DIR=${2:?usage: gpu_put.sh PIECE DIR [NAME]}
NAME=${3:-$(basename "$SRC")}
mkdir -p "$DIR"
cp "$SRC" "$DIR/.$NAME.partial"
mv "$DIR/.$NAME.partial" "$DIR/$NAME"
