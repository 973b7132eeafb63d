"""How `make test` shares the tests between two pytest-xdist workers (`-n 2 --dist loadgroup`).

Every test gets an `xdist_group`: by default its file, so a file goes whole to one worker, in file
order, and its module fixtures run once. The two rig files are the long pole (several minutes each):
their tests are independent runs on the worker's own rig and are split one group per test, except
the tests that share `full_map` (one map run, then checks on what it left), which stay together.
Groups are handed out longest first (SLOW_UNITS), so a multi-minute group never starts last and
runs alone; `--no-loadscope-reorder` keeps that order. Order inside a group never changes.
"""

from __future__ import annotations

import pytest

# Files whose tests may run on different workers; the fixtures that keep tests together inside them.
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "tests/rig/test_rig_map.py": ("full_map",),
    "tests/rig/test_rig_calibrate.py": (),
}

# Longest first, from `--durations` of `-n 2` runs on this 2-core box under load (load average 15-17:
# the full-map group ~6 min, each other rig test 1.5-4 min, the playbook files 2-5 min).
SLOW_UNITS = (
    "tests/rig/test_rig_map.py::full_map",
    "tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab",
    "tests/rig/test_rig_calibrate.py::test_preflight_health_check_stops_the_map_before_any_server",
    "tests/rig/test_rig_map.py::test_worker_killed_mid_case_then_resume",
    "tests/rig/test_rig_calibrate.py::test_healthy_fleet_passes_with_every_gpu_measured_in_the_engine_image",
    "tests/rig/test_rig_map.py::test_missing_hca_on_worker_fails_the_gate_closed",
    "tests/rig/test_rig_calibrate.py::test_planted_slow_gpu_fails_the_gate_by_node_index_and_figure",
    "tests/ansible/test_quick_map.py",
    "tests/rig/test_rig_calibrate.py::test_check_prints_every_gpus_command_and_runs_nothing",
    "tests/ansible/test_vllm_flow.py",
    "tests/ansible/test_console.py",
    "tests/calibrate/test_calibrate_playbook.py",
)


def group_of(item: pytest.Item) -> str:
    """The scheduling unit of a test: its file, or (split files) the test or its shared fixture."""
    path, _, rest = item.nodeid.partition("::")
    if path not in SPLIT_FILES:
        return path
    shared = [name for name in SPLIT_FILES[path] if name in getattr(item, "fixturenames", ())]
    test = rest.split("[", 1)[0]
    return f"{path}::{shared[0] if shared else test}"


def unit_rank(group: str) -> int:
    """Position in SLOW_UNITS; everything else after them, in collection order."""
    return SLOW_UNITS.index(group) if group in SLOW_UNITS else len(SLOW_UNITS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its group, then a stable sort of the groups, longest first."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
    items.sort(key=lambda item: unit_rank(group_of(item)))
