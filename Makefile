# tfcluster: `make demo` runs a short distributed training on local processes,
# `make test` runs the whole suite. Both create and fill the virtualenv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Docker-backed tests (real sshd nodes, the compose cluster, fake GCE whose
# instances are containers) run whenever a Docker engine answers.
DOCKER_OK := $(shell docker info >/dev/null 2>&1 && echo yes)
ifeq ($(DOCKER_OK),yes)
TEST_MARKERS ?=
else
TEST_MARKERS ?= not docker and not e2e
endif
PYTEST_ARGS ?=

.PHONY: help venv demo test e2e lint bench clean
.DEFAULT_GOAL := help

help:
	@echo "make demo   - short distributed training (ps + 2 workers + chief) on local processes"
	@echo "make test   - the whole test suite (docker tests too when docker answers)"
	@echo "make e2e    - the whole GCE lifecycle offline: fake GCE whose instances are containers"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - benchmarks (bench/*.py): ratios measured in one run"
	@echo "make cluster-image | cluster-up | cluster-down - the docker-compose cluster"

# constraints.txt: the exact versions CI tests (pyproject.toml has ranges).
$(STAMP): pyproject.toml trainer/requirements.txt trainer/requirements-no-deps.txt \
		requirements-dev.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[trainer,dev]'
	$(PY) -m pip install -q --no-deps -c constraints.txt -r trainer/requirements-no-deps.txt
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(PY) deploy.py train

# With docker, the docker tests (mostly waits) run beside the rest (mostly
# CPU) in a session of their own: scripts/test_streams.py.
test: $(STAMP)
	$(PY) scripts/test_streams.py -m "$(TEST_MARKERS)" $(PYTEST_ARGS)

e2e: $(STAMP)
	@docker info >/dev/null 2>&1 || { echo "make e2e needs a Docker engine that answers (docker info)"; exit 1; }
	bash scripts/install-system-deps.sh
	$(PY) -m pytest -m e2e $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check infra trainer tfcluster_cli deploy.py tests bench examples scripts
	$(VENV)/bin/mypy

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

-include mk/*.mk
