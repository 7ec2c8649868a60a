# The two quickstart commands: `make demo` (a local fleet on the embedded backend) and
# `make test` (the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit integration demo up bench lint clean

$(STAMP): requirements-dev.txt layers/wsfleet/pyproject.toml worker/pyproject.toml local/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e layers/wsfleet -e worker -e local
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest tests

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

demo: $(STAMP)
	$(BIN)/wsfleet demo

up: $(STAMP)
	$(BIN)/wsfleet local up

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache
