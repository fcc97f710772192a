#!/usr/bin/env bash
# The pack's own dependencies for the H200 test machine (Python 3.12, no network): the packages of this
# checkout's .venv (`make setup`) that the machine's image lacks or has in another version, as wheels.
# bench/gpu_e2e.sh installs them into their own site dir, beside (not mixed with) vLLM's.
#
#   bash bench/gpu_pack_deps.sh DIR      # DIR: a git-ignored folder, e.g. .carry/pack-deps (~38 MB, one carry)
set -euo pipefail
DIR=${1:?usage: gpu_pack_deps.sh DIR}
cd "$(dirname "$0")/.."
mkdir -p "$DIR"
# On the image already (device KINDS.md's package list), and compiled against its numpy/torch: kept.
# The docs site's build tools (`make docs`, mkdocs and what it pulls) are test extras, never run there.
DOCS_ONLY='^(babel|backrefs|ghp-import|markdown|mergedeep|mkdocs[a-z-]*|paginate|pymdown-extensions|pyyaml_env_tag|watchdog)=='
ON_IMAGE='^(contourpy|cycler|fonttools|kiwisolver|matplotlib|numpy|pillow|pyparsing|psutil|nvidia-ml-py|pyarrow|pyflakes|py-spy|pytest|pytest-timeout|iniconfig|pluggy|pygments|regex|six|python-dateutil|certifi|idna|urllib3|requests|charset-normalizer)=='
PLAT=()
for n in 39 35 34 31 28 27 26 24 17; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
.venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | grep -viE "$ON_IMAGE" | grep -viE "$DOCS_ONLY" > "$DIR/requirements.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" -r "$DIR/requirements.txt" 2>&1 |
  grep -v '^WARNING' || true
echo "pack deps: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
