# Set-up is part of every target: a virtualenv in .venv with the CPU build of torch.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   ?= torch==2.13.0
# pytest processes (pytest-xdist, one test file per process at a time): CI has 2 cores; `make test JOBS=8` for more
JOBS    ?= 2

.PHONY: install test test-fast lint bench demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" || $(BIN)/pip install -q "torch>=2.4"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest tests -n $(JOBS) --dist loadfile

# ruff (lint, then format as a check) and mypy, configured in pyproject.toml
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy

# the inner loop: every package's quick tests, under 2 minutes on 2 cores (tests marked slow are left to `make test`)
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow" -n $(JOBS) --dist loadfile

demo: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python scripts/demo.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs demo .pytest_cache .hypothesis .ruff_cache .mypy_cache
