"""tests/conftest.py's xdist units: what may run on the other worker, and what must stay together."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import SLOW_UNITS, unit_of, unit_rank

REPO = Path(__file__).resolve().parents[2]


def test_a_file_is_one_unit_so_its_module_fixtures_run_once() -> None:
    assert unit_of("tests/loadgen/test_enginesim.py::test_a") == "tests/loadgen/test_enginesim.py"
    assert unit_of("tests/loadgen/test_enginesim.py::test_b[x]") == "tests/loadgen/test_enginesim.py"


def test_the_full_map_checks_stay_together_and_the_other_rig_runs_split() -> None:
    first = unit_of("tests/rig/test_rig_map.py::test_full_map_completes_on_two_hosts")
    stale = unit_of("tests/rig/test_rig_map.py::test_servers_left_by_earlier_runs_are_refused_in_preflight")
    mixed = unit_of("tests/rig/test_rig_map.py::test_mixed_tag_runs_only_the_ab")
    check = unit_of("tests/rig/test_rig_calibrate.py::test_check_prints_every_gpus_command_and_runs_nothing")
    assert first == stale == "tests/rig/test_rig_map.py"
    assert len({first, mixed, check}) == 3


def test_every_slow_unit_names_a_unit_that_exists_and_comes_first() -> None:
    for unit in SLOW_UNITS:
        path, _, name = unit.partition("::")
        assert (REPO / path).is_file(), unit
        assert not name or f"def {name}(" in (REPO / path).read_text(), unit
    assert unit_rank("tests/rig/test_rig_map.py") == 0
    assert unit_rank("tests/analysis/test_analysis_state.py") == len(SLOW_UNITS)


def test_two_workers_keep_a_shared_module_fixture_on_one_worker(tmp_path: Path) -> None:
    """A real `pytest -n 2` with this conftest: the tests sharing a module fixture meet on one worker
    (the fixture runs once), the split tests go to the other."""
    rig = tmp_path / "tests" / "rig"
    rig.mkdir(parents=True)
    (tmp_path / "tests" / "__init__.py").touch()
    (rig / "__init__.py").touch()
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "log"
    tests = [
        "import os, time, pytest",
        "@pytest.fixture(scope='module')",
        "def full_map():",
        f"    open({str(log)!r}, 'a').write('fixture\\n')",
        "def run(name):",
        "    time.sleep(0.3)",
        f"    open({str(log)!r}, 'a').write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')",
        *(
            f"def {name}(full_map): run('shared')"
            for name in (
                "test_full_map_completes_on_two_hosts",
                "test_worker_started_before_head",
                "test_docker_argv_carries_rdma_devices_and_nccl_env",
                "test_servers_left_by_earlier_runs_are_refused_in_preflight",
            )
        ),
        "def test_mixed_tag_runs_only_the_ab(): run('split')",
        "def test_worker_killed_mid_case_then_resume(): run('split')",
    ]
    (rig / "test_rig_map.py").write_text("\n".join(tests) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests"],
        cwd=tmp_path,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    assert lines.count("fixture") == 1, lines
    shared = {line.split()[1] for line in lines if line.startswith("shared ")}
    assert len(shared) == 1 and len([line for line in lines if line.startswith("shared ")]) == 4, lines
