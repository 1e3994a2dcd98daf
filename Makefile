# Two commands set up everything on a fresh machine:  `make run`  and  `make test`.
# TORCH picks the torch build: the default installs the CPU wheel here; on a GPU host use e.g.
#   make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" run
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
# the stamp names the torch spec, so `make TORCH=... run` installs that build into an existing .venv too
STAMP := $(VENV)/.installed-$(shell echo '$(TORCH)' | cksum | cut -d' ' -f1)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

run: $(STAMP)
	PATH=$(VENV)/bin:$$PATH bash scripts/default_job.sh

# the tests run on WORKERS processes (pytest-xdist; auto: one per core, 0: in this process; the tests sharing a module
# fixture on one of them: tests/conftest.py); `make test-fast` is the inner loop: no end-to-end run, no server
WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(WORKERS) --dist loadgroup

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not server"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: install run test test-fast lint
