# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create (once) and reuse the virtual environment in .venv.
PYTHON ?= python3
# The suite runs on this many pytest-xdist workers: most tests wait on sockets, processes
# and timers rather than the CPU, so three keep a 2-core machine busy (PYTEST_WORKERS=0: one
# process, as plain pytest).
PYTEST_WORKERS ?= 3
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck layers proto proto-check pytest conformance serve clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/apiary demo

test: $(STAMP)
	@scripts/ensure-chromium
	$(BIN)/ruff check src tests scripts bench examples
	$(BIN)/ruff format --check src tests scripts bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/genproto.py --check
	$(BIN)/python scripts/gendocs.py --check
	$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts bench examples
	$(BIN)/ruff format --check src tests scripts bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

proto: $(STAMP)
	$(BIN)/python scripts/genproto.py

proto-check: $(STAMP)
	$(BIN)/python scripts/genproto.py --check

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

conformance: $(STAMP)
	$(BIN)/python -m tests.conformance.report

serve: $(STAMP)
	$(BIN)/apiary serve

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
