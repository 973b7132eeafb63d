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

.PHONY: sglang-client vllm-client all venv run test lint unit system-deps zipapp bench clean role-docs collection collection-sanity sanity-venvs

all: test

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,calibrate,labs]'
	@touch $(STAMP)

venv: $(STAMP)

# The node-side client: one file, standard library + its HTTP client, no install step. And the
# node-side calibration (enginesim.calibrate, run by the engine image's python, which has torch).
zipapp: $(STAMP)
	$(PY) -m loadgen.build_zipapp build/loadgen.pyz
	$(PY) -m enginesim.calibrate.zipapp build/calibrate.pyz

# SGLang's own benchmark client without the engine (the sglang wheel --no-deps + its light deps) in
# .sglang-client/: the tests that run the real reference client against enginesim use it.
sglang-client: $(STAMP)
	PYTHON=$(PY) bash tools/install_sglang_client.sh .sglang-client

# vLLM's own benchmark client (`vllm bench serve`) in .vllm-client/: the whole vllm wheel with torch
# (about 11 GB, 3-5 minutes), since the client imports torch. The test that runs it against enginesim uses it.
vllm-client: $(STAMP)
	PYTHON=$(PY) bash tools/install_vllm_client.sh .vllm-client

# Debian packages the multi-host test rig needs (sshd, ip). Installed only when missing, only as root.
system-deps:
	@bash tests/rig/install_system_deps.sh

run: $(STAMP) zipapp
	$(VENV)/bin/ansible-playbook quick_map.yml $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ansible-lint --profile production --offline

# Every skipped test fails the run unless .ci/allowed-skips.txt allows it; the gate prints that list
# and every skip of the run each time (tests/conftest.py writes the report, .ci/check_skips.py judges).
SKIP_REPORT := build/pytest-skips.json
# Both cores: each xdist worker takes whole test files (the rig files test by test), longest first
# (tests/conftest.py), and builds its own rig. One area: .venv/bin/pytest -q tests/<area> (no -n needed).
PYTEST_WORKERS ?= 2
# lint, ansible-test's sanity environments and vLLM's client (pip: mostly download and unpack) run side by side.
test: $(STAMP) system-deps zipapp sglang-client
	$(MAKE) --no-print-directory -j3 --output-sync=target lint sanity-venvs vllm-client
	@rm -f $(SKIP_REPORT)
	QUICKMAP_SKIP_REPORT=$(SKIP_REPORT) $(VENV)/bin/pytest -q -ra -n $(PYTEST_WORKERS) --durations=15; rc=$$?; \
	$(PY) .ci/check_skips.py $(SKIP_REPORT) .ci/allowed-skips.txt; gate=$$?; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$gate

# Speed and accuracy targets live here, not in timed tests. Run on a quiet box; each prints medians.
# Every benchmark runs (from any clone: they need nothing outside the repository); the target fails at
# the end, naming each benchmark that missed its target or could not run. loadgen's comparison with
# SGLang's own client is optional (SGLANG_BENCH_SRC, see benchmarks/bench_loadgen.py) and says so when
# it is skipped.
# (bench_loadgen exits non-zero on a missed target only with --strict, so it gets it here.)
BENCHES := bench_analysis bench_enginesim bench_loadgen bench_orchestration bench_rig_orchestration bench_labs bench_fidelity
bench: $(STAMP) zipapp
	$(PY) -m pip install -q -e '.[dev,calibrate,labs,bench]'
	@missed=""; for b in $(BENCHES); do \
	  strict=""; if [ $$b = bench_loadgen ]; then strict=--strict; fi; \
	  echo "== benchmarks/$$b.py $$strict"; $(PY) benchmarks/$$b.py $$strict || missed="$$missed $$b"; \
	done; \
	if [ -n "$$missed" ]; then echo "make bench: every benchmark ran; missed or failed:$$missed"; exit 1; fi; \
	echo "make bench: every benchmark ran and met its target"

# The quickmap.serving collection (collection/README.md), assembled from the checkout and built by
# ansible-galaxy into build/collection/, installed under build/collection/install (ANSIBLE_COLLECTIONS_PATH).
collection: $(STAMP)
	rm -rf build/collection
	$(PY) tools/build_collection.py build/collection --install build/collection/install

# ansible-test sanity on the assembled collection (log: build/collection-sanity.log). make test runs it
# too, as tests/collection/test_sanity.py.
collection-sanity: $(STAMP)
	$(PY) tools/collection_sanity.py

# ansible-test's own virtual environment per sanity test (its pinned requirements, pip-installed): built
# once by the set-up into build/ansible-test-home (`ansible-test sanity --prime-venvs`, no check runs),
# so the test above only runs the checks. ansible-test reuses an environment while its requirements
# match and rebuilds it when they change; the stamp lives in that HOME and goes with it. The changelog
# check has nothing to check here (no changelogs/ in the collection) and never builds its environment.
SANITY_VENVS_STAMP := build/ansible-test-home/.primed-stamp
$(SANITY_VENVS_STAMP): $(STAMP)
	$(PY) tools/collection_sanity.py --log build/collection-sanity-prime.log --prime-venvs --skip-test changelog
	@touch $@

sanity-venvs: $(SANITY_VENVS_STAMP)

# Regenerate every role's argument_specs.yml options and README variable table from defaults/main.yml.
role-docs: $(STAMP)
	$(PY) tools/role_docs.py

clean:
	rm -rf build .pytest_cache .ruff_cache
