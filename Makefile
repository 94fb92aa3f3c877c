# Two commands matter: `make demo` (install + the main job on the embedded SQLite default)
# and `make test` (install + the whole test suite). Everything runs offline.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= ../shared/data/realtimeqa
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: install lock browser demo lint docs test test-unit test-integration bench clean

install: $(VENV)/.installed

# Every dependency comes from requirements.lock: exact versions with their sha256 hashes
# (`pip --require-hashes`), the whole closure, made by `make lock` (uv) from pyproject.toml. Then
# torch, by itself (--no-deps: its own dependencies are in the lock):
# - no NVIDIA GPU: the CPU build by its local version label (+cpu). PyPI's plain torch==2.13.0 is the
#   CUDA build with 18 nvidia packages (several GB). The label is found on PyTorch's CPU index (an
#   extra index, asked once with a short timeout) or in a local wheel folder (PIP_FIND_LINKS).
# - an NVIDIA GPU (nvidia-smi lists one; GPU=1/GPU=0 overrides): PyPI's CUDA build with its nvidia
#   packages, and faiss-gpu (the [gpu] extra). These are not in the lock (it is made for the CPU).
# The project itself goes in last, editable, with no dependency resolution left to do; `pip check`
# proves the set is whole.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
GPU ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --require-hashes --no-deps -r requirements.lock
ifeq ($(GPU),1)
	$(PIP) install "torch==2.13.0" "faiss-gpu-cu12>=1.14"
else
	$(PIP) install --no-deps "torch==2.13.0+cpu" --extra-index-url $(TORCH_INDEX) --retries 1 --timeout 15
endif
	$(PIP) install --no-deps --no-build-isolation -e .
	$(PIP) check
	touch $@

# Refresh the lock files from pyproject.toml (newest versions its ranges allow, resolved for CPython
# 3.11 on x86-64 Linux with the CPU torch from the local wheel folder or PyTorch's CPU index).
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install uv
	echo "torch==2.13.0+cpu" > $(VENV)/torch-cpu.txt
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --extra scale --extra ray --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --overrides $(VENV)/torch-cpu.txt --no-emit-package torch \
		$(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),--extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match) \
		--custom-compile-command "make lock" -o requirements.lock

demo: install
	$(PY) scripts/demo.py --data "$(DATA)" $(DEMO_ARGS)

# The house checks, each configured in pyproject.toml: the architecture contract ([tool.importlinter]:
# a back-edge or a cycle fails the build), ruff's lint and format ([tool.ruff]), mypy, strict on
# serving/, store/, indexer/ and settings ([tool.mypy]), and the documentation site (mkdocs.yml),
# whose reference pages are generated from the code.
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(MAKE) docs

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# Chromium and ChromeDriver for the browser tests of the pages (installed with apt-get where it may).
browser:
	bash scripts/install_browser.sh

# The suite in TEST_WORKERS processes (pytest-xdist): many tests wait on servers, subprocesses and
# disks, so on 2 cores two workers left about a third of the CPU idle (user+sys 19 of 2x12.5
# minutes); a third worker fills it. TEST_WORKERS=0: one process.
# --dist worksteal: a worker that runs out of tests takes some of another's, so the suite does not
# end with one worker alone on a queue of slow tests.
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist worksteal)
test: install lint browser
	$(PY) -m pytest $(XDIST)

test-unit: install lint
	$(PY) -m pytest $(XDIST) -m "not integration"

test-integration: install browser
	$(PY) -m pytest $(XDIST) -m integration

bench: install
	$(PY) bench/bench_ingest.py --data "$(DATA)"
	$(PY) bench/bench_answers.py --data "$(DATA)"

clean:
	rm -rf $(VENV) .sqa
