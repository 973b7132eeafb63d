# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export LC_ALL := C.UTF-8
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# Extra arguments for ansible-playbook, e.g. make run ARGS="-i inventory/dual --tags mixed"
ARGS ?=

.PHONY: all venv run test lint unit system-deps zipapp bench clean role-docs

all: test

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,calibrate]'
	@touch $(STAMP)

venv: $(STAMP)

# The node-side client: one file, standard library + its HTTP client, no install step. And the
# node-side calibration (enginesim.calibrate, run by the engine image's python, which has torch).
zipapp: $(STAMP)
	$(PY) -m loadgen.build_zipapp build/loadgen.pyz
	$(PY) -m enginesim.calibrate.zipapp build/calibrate.pyz

# Debian packages the multi-host test rig needs (sshd, ip). Installed only when missing, only as root.
system-deps:
	@bash tests/rig/install_system_deps.sh

run: $(STAMP) zipapp
	$(VENV)/bin/ansible-playbook quick_map.yml $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ansible-lint --profile production --offline

test: $(STAMP) system-deps zipapp lint
	$(VENV)/bin/pytest -q -ra

# Speed and accuracy targets live here, not in timed tests. Run on a quiet box; each prints medians.
bench: $(STAMP) zipapp
	$(PY) -m pip install -q -e '.[dev,calibrate,bench]'
	$(PY) benchmarks/bench_analysis.py
	$(PY) benchmarks/bench_enginesim.py
	$(PY) benchmarks/bench_loadgen.py
	$(PY) benchmarks/bench_orchestration.py
	$(PY) benchmarks/bench_rig_orchestration.py
	$(PY) benchmarks/bench_labs.py

# Regenerate every role's argument_specs.yml options and README variable table from defaults/main.yml.
role-docs: $(STAMP)
	$(PY) tools/role_docs.py

clean:
	rm -rf build .pytest_cache .ruff_cache
