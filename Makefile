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

## run: the demo: a bank on a local cluster (embedded ZooKeeper, 3 storage nodes, 2 servers)
## through a storage node and a server being killed, then a report
run: $(STAMP)
	$(VENV)/bin/waltz demo

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
