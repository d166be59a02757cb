# Each target sets itself up: a virtual environment in .venv with torch 2.13.0
# (the CPU build) and memoplan installed in editable mode with its test extras.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memoplan-setup

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/memoplan verify plans/cnn_bn_dropout.memplan

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/resolve_scale.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis
