"""tests/conftest.py's xdist groups: what may run on the other worker, and what must stay together."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import SLOW_UNITS, group_of, unit_rank


def item(nodeid: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=["request", *fixtures])


def test_a_file_is_one_group_so_its_module_fixtures_run_once() -> None:
    a = item("tests/loadgen/test_enginesim.py::test_a")
    b = item("tests/loadgen/test_enginesim.py::test_b[x]")
    assert group_of(a) == group_of(b) == "tests/loadgen/test_enginesim.py"


def test_the_full_map_checks_stay_together_and_the_other_rig_runs_split() -> None:
    first = item("tests/rig/test_rig_map.py::test_full_map_completes_on_two_hosts", "full_map", "rig")
    stale = item(
        "tests/rig/test_rig_map.py::test_servers_left_by_earlier_runs_are_refused_in_preflight", "full_map"
    )
    mixed = item("tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab", "rig")
    health = item(
        "tests/rig/test_rig_calibrate.py::test_check_prints_every_gpus_command_and_runs_nothing", "rig"
    )
    assert group_of(first) == group_of(stale) == "tests/rig/test_rig_map.py::full_map"
    assert group_of(mixed) == "tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab"
    assert len({group_of(first), group_of(mixed), group_of(health)}) == 3


def test_every_slow_unit_names_a_group_that_exists_and_comes_first() -> None:
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    for unit in SLOW_UNITS:
        path, _, name = unit.partition("::")
        assert (repo / path).is_file(), unit
        assert not name or f"def {name}(" in (repo / path).read_text(), unit
    assert unit_rank("tests/rig/test_rig_map.py::full_map") == 0
    assert unit_rank("tests/analysis/test_analysis_state.py") == len(SLOW_UNITS)
