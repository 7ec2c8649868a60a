# The two quickstart commands: `make demo` (a local fleet on the embedded backend) and
# `make test` (the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit integration lint-py demo up bench clean

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

# Static Python checks, configured in pyproject.toml: ruff's lint rules over the repository and
# mypy --strict over the shipped code. Both run even if the first fails (.ci/lint calls this).
lint-py: $(STAMP)
	@status=0; \
	echo "ruff check ."; $(BIN)/ruff check . || status=1; \
	echo "mypy"; $(BIN)/mypy || status=1; \
	exit $$status

demo: $(STAMP)
	$(BIN)/wsfleet demo

up: $(STAMP)
	$(BIN)/wsfleet local up

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache
