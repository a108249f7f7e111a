# Set-up and everyday commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,local]'
	touch $(STAMP)

## run: a local cluster (embedded ZooKeeper, 3 storage nodes, CreateCluster); Ctrl-C stops it
run: $(STAMP)
	$(VENV)/bin/waltz local up

## test: lint, then the whole test suite
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

## bench: the storage benchmark (docs/benchmarks.md)
bench: $(STAMP)
	$(VENV)/bin/waltz storage bench

clean:
	rm -rf $(VENV) .waltz-local
