"""How `make test` shares the tests between two pytest-xdist workers (`-n 2`).

A scheduling unit is a test file by default: it goes whole to one worker, in file order, and its module
fixtures run once. The two rig files are the long pole (several minutes each): the tests in
SPLIT_TESTS are independent runs on the worker's own rig and are units of their own; the rest of
their file stays one unit (in test_rig_map.py, the checks that share the `full_map` run). The labs
files in SPLIT_BY_FLAVOUR run one playbook per engine flavour in a module fixture parametrised by the
flavour: the tests of one flavour (id `[sglang]` / `[vllm]`) are one unit, so the two flavours' runs
can go to both workers; each flavour's run still happens once. The mechanism labs file starts both
flavours' runs at once in one unit instead (they mostly wait on the emulated clock: ~100 s of CPU in
a 5-minute run), so it holds one worker for about the time of one run. (The advanced labs did the
same and quant_matrix's real-time runs came out "saturated" beside a CPU-bound file: split again.)
Units are handed out longest first (SLOW_UNITS, then collection order), so a multi-minute unit never
starts last and runs alone. Order inside a unit never changes.

Skip report: Session-wide hook: with QUICKMAP_SKIP_REPORT=FILE set, every skipped test (node id and reason) is
written to FILE as JSON when the session ends, for the skip gate (.ci/check_skips.py).
"""

from __future__ import annotations

import json
import os

import pytest

_SKIPS: list[dict] = []


def _reason(report) -> str:
    longrepr = report.longrepr  # for a skip: (file, line, "Skipped: reason")
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append({"nodeid": report.nodeid, "when": report.when, "reason": _reason(report)})


def pytest_collectreport(report) -> None:
    if report.skipped:  # a whole module skipped at import
        _SKIPS.append({"nodeid": report.nodeid, "when": "collect", "reason": _reason(report)})


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("QUICKMAP_SKIP_REPORT")
    # The controller sees every worker's reports; a worker (it has workerinput) writes nothing. Not the
    # PYTEST_XDIST_WORKER variable: a pytest a test starts inherits it and would never write its report.
    if path and not hasattr(session.config, "workerinput"):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"exitstatus": int(exitstatus), "skips": _SKIPS}, f, indent=1)
        os.replace(tmp, path)


# Tests that are units of their own (each is a whole playbook run on the rig, needing nothing from the
# other tests of its file).
SPLIT_TESTS = frozenset(
    {
        "tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab",
        "tests/rig/test_rig_map.py::test_missing_hca_on_worker_fails_the_gate_closed",
        "tests/rig/test_rig_map.py::test_worker_killed_mid_case_then_resume",
        "tests/rig/test_rig_calibrate.py::test_check_prints_every_gpus_command_and_runs_nothing",
        "tests/rig/test_rig_calibrate.py::test_healthy_fleet_passes_with_every_gpu_measured_in_the_engine_image",
        "tests/rig/test_rig_calibrate.py::test_planted_slow_gpu_fails_the_gate_by_node_index_and_figure",
        "tests/rig/test_rig_calibrate.py::test_preflight_health_check_stops_the_map_before_any_server",
    }
)

# Files whose module fixture runs one playbook per engine flavour (params=["sglang", "vllm"]): a test
# whose whole id parameter is a flavour belongs to that flavour's unit; its other tests to the file's.
SPLIT_BY_FLAVOUR = frozenset(
    {
        "tests/labs/test_advlabs_enginesim.py",
        "tests/labs/test_sched_profile_lab.py",
    }
)
FLAVOURS = ("sglang", "vllm")

# Longest first, from benchmarks/bench_test_suite.py (-n 2 on this 2-core box): the labs (both
# flavours at once, 6 min, ~170 s of CPU) first; beside them the rig's runs that mostly wait (its full
# map and checks, the mixed tag, the labs and P/D on the rig: 1.5-2 min each, a third to a half of it
# CPU), so the labs' emulator keeps its schedule; then the CPU-bound playbook files (the quick map and
# the faults, ~4-5 min each at ~90 % of a core), the advanced labs (2-2.5 min a flavour), the rest.
# A worker takes the next unit when it has two tests left: the first three units start the run.
SLOW_UNITS = (
    "tests/labs/test_labs_enginesim.py",
    "tests/rig/test_rig_map.py",
    "tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab",
    "tests/labs/test_labs_rig.py",
    "tests/labs/test_pd_disagg_rig.py",
    "tests/ansible/test_quick_map.py",
    "tests/security/test_faults.py",
    "tests/labs/test_advlabs_enginesim.py[vllm]",
    "tests/labs/test_advlabs_enginesim.py[sglang]",
    "tests/collection/test_sanity.py",
    "tests/ansible/test_vllm_flow.py",
    "tests/labs/test_pd_disagg_lab.py",
    "tests/rig/test_rig_map.py::test_worker_killed_mid_case_then_resume",
    "tests/rig/test_rig_calibrate.py::test_preflight_health_check_stops_the_map_before_any_server",
    "tests/rig/test_rig_calibrate.py::test_healthy_fleet_passes_with_every_gpu_measured_in_the_engine_image",
    "tests/rig/test_rig_map.py::test_missing_hca_on_worker_fails_the_gate_closed",
    "tests/rig/test_rig_calibrate.py::test_planted_slow_gpu_fails_the_gate_by_node_index_and_figure",
    "tests/labs/test_sched_profile_lab.py[vllm]",
    "tests/labs/test_sched_profile_lab.py[sglang]",
    "tests/rig/test_rig_calibrate.py::test_check_prints_every_gpus_command_and_runs_nothing",
    "tests/ansible/test_console.py",
    "tests/calibrate/test_calibrate_playbook.py",
)


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: the test itself when listed in SPLIT_TESTS, its file and flavour
    in a SPLIT_BY_FLAVOUR file when its id parameter is a flavour, else its file."""
    path, _, rest = nodeid.partition("::")
    name, _, param = rest.partition("[")
    test = f"{path}::{name}"
    if test in SPLIT_TESTS:
        return test
    if path in SPLIT_BY_FLAVOUR and param.removesuffix("]") in FLAVOURS:
        return f"{path}[{param.removesuffix(']')}]"
    return path


def unit_rank(unit: str) -> int:
    """Position in SLOW_UNITS; everything else after them, in collection order."""
    return SLOW_UNITS.index(unit) if unit in SLOW_UNITS else len(SLOW_UNITS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A stable sort of the tests by their unit's rank: the slow units first."""
    items.sort(key=lambda item: unit_rank(unit_of(item.nodeid)))


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest without xdist: nothing to schedule
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:

    class UnitScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduling with our units as scopes, in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    @pytest.hookimpl(optionalhook=True)  # `pytest -p no:xdist` still starts
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> UnitScheduling:
        """Every `-n N` run schedules by unit (the --dist mode is not consulted)."""
        config.option.loadscopereorder = False
        return UnitScheduling(config, log)
