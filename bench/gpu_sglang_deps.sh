#!/usr/bin/env bash
# SGLang 0.5.16 for the H200 test machine (Python 3.12, torch 2.11.0+cu130, no network), in four pieces
# of at most 50 MB (one command may take 64 MiB along, the working tree included). docs/SGLANG.md
# says why each package is there and what was left out; bench/gpu_sglang.sh installs them.
#
#   bash bench/gpu_sglang_deps.sh DIR    # DIR: a git-ignored folder, e.g. .carry/sglang
#
# DIR/a: sgl-kernel without flash_ops.abi3.so (zipped; the FA3 kernels, 1.1 GB, unused with
#        --attention-backend triton) + transformers 5.12.1; DIR/b: SGLang + its small dependencies;
# DIR/c: xgrammar, tokenizers 0.22.2, sgl-deep-gemm; DIR/d: FlashInfer (imported, not used), HF datasets.
set -euo pipefail
DIR=${1:?usage: gpu_sglang_deps.sh DIR}
mkdir -p "$DIR"/a "$DIR"/b/deps "$DIR"/c "$DIR"/d "$DIR"/big
PLAT=()
for n in 39 35 34 31 28 27 24 17; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
# PIP_CONSTRAINT=: the machine's pip caps torch, which none of these wheels is.
get() { PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
          --implementation cp "${PLAT[@]}" --platform manylinux2014_x86_64 -d "$@" 2>&1 | grep -v '^WARNING' || true; }
get "$DIR"/b sglang==0.5.16
get "$DIR"/a transformers==5.12.1
get "$DIR"/c xgrammar==0.2.1 tokenizers==0.22.2 sgl-deep-gemm==0.1.4.post1
get "$DIR"/d flashinfer-python==0.6.14
# sglang.bench_serving (the benchmark's load generator) imports HF datasets at import time (its MMMU
# loader); the image has its other dependencies (pyarrow, pandas, xxhash, fsspec, aiohttp).
get "$DIR"/d datasets==5.1.0 multiprocess==0.70.19
get "$DIR"/b/deps \
  annotated_types==0.8.0 anthropic==2.14.0 apache_tvm_ffi==0.1.11 asttokens==3.0.2 \
  blobfile==3.0.0 cffi==2.1.1 compressed_tensors==0.17.0 decorator==5.3.1 dill==0.4.1 \
  distro==1.9.0 dnspython==2.9.2 docstring_parser==0.18.0 easydict==1.14 email_validator==2.4.0 \
  executing==2.3.0 fastapi==0.136.3 gguf==0.19.0 httptools==0.9.0 interegular==0.3.3 \
  ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 jiter==0.19.0 jsonschema==4.26.0 \
  jsonschema_specifications==2025.9.1 llguidance==1.7.6 loguru==0.7.3 matplotlib_inline==0.2.2 \
  msgspec==0.23.0 openai==2.6.1 openai_harmony==0.0.4 orjson==3.13.0 parso==0.8.7 \
  partial_json_parser==0.2.1.1.post7 pexpect==4.9.0 prompt_toolkit==3.0.53 ptyprocess==0.7.0 \
  pure_eval==0.2.4 pybase64==1.5.1 pycparser==3.12 pycryptodomex==3.24.2 pydantic==2.14.4 \
  pydantic_core==2.50.5 python_dotenv==1.2.4 python_multipart==0.0.34 pyzmq==27.3.0 \
  referencing==0.37.0 rpds_py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 soundfile==0.13.1 \
  sse_starlette==3.7.0 stack_data==0.6.3 starlette==1.10.0 traitlets==5.16.1 \
  typing_inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 wcwidth==0.9.4 websockets==17.4 \
  zstandard==0.25.0
if [ ! -f "$DIR"/a/sgl_kernel_slim.zip ]; then
  get "$DIR"/big sglang-kernel==0.4.5
  python3 - "$DIR" <<'PY'
import sys, zipfile, pathlib
d = pathlib.Path(sys.argv[1])
src = next((d / "big").glob("sglang_kernel-0.4.5-*.whl"))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(d / "a" / "sgl_kernel_slim.zip", "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if item.filename != "sgl_kernel/flash_ops.abi3.so":
            zout.writestr(item, zin.read(item.filename))
PY
  rm -rf "$DIR"/big
fi
du -sh "$DIR"/a "$DIR"/b "$DIR"/c "$DIR"/d
