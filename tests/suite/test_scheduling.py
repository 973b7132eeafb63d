"""tests/conftest.py's xdist units: what may run on the other worker, and what must stay together."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import FLAVOURS, SLOW_UNITS, SPLIT_BY_FLAVOUR, unit_of, unit_rank

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


def test_each_flavour_of_a_labs_file_is_a_unit_and_its_other_tests_stay_with_the_file() -> None:
    labs = "tests/labs/test_sched_profile_lab.py"
    vllm = {unit_of(f"{labs}::{t}[vllm]") for t in ("test_the_scheduler_x", "test_the_trace_y")}
    assert vllm == {f"{labs}[vllm]"}
    assert unit_of(f"{labs}::test_the_trace_y[sglang]") == f"{labs}[sglang]"
    assert unit_of(f"{labs}::test_check_mode_starts_nothing") == labs
    # an id whose parameter is more than a flavour, or a file not listed, keeps its file's unit
    assert unit_of(f"{labs}::test_z[sglang-extra]") == labs
    other = "tests/ansible/test_bench_client.py"
    assert unit_of(f"{other}::test_x[sglang]") == other


def test_the_labs_files_that_start_both_flavours_at_once_are_one_unit() -> None:
    """Both flavours' runs start in one module fixture: split by flavour, each worker would start both."""
    for path in ("tests/labs/test_labs_enginesim.py",):
        assert path not in SPLIT_BY_FLAVOUR
        assert "yield from both_flavours(" in (REPO / path).read_text(), path
        assert unit_of(f"{path}::test_x[vllm]") == unit_of(f"{path}::test_x[sglang]") == path


def test_every_flavour_split_file_runs_its_playbook_in_a_module_fixture_per_flavour() -> None:
    """The split is sound only while the flavour's run is a module fixture parametrised by flavour: a
    worker then runs it once for the flavour it was given."""
    assert FLAVOURS == ("sglang", "vllm")
    for path in SPLIT_BY_FLAVOUR:
        assert '@pytest.fixture(scope="module", params=["sglang", "vllm"])' in (REPO / path).read_text(), path


def test_every_slow_unit_names_a_unit_that_exists_and_comes_first() -> None:
    for unit in SLOW_UNITS:
        path, _, name = unit.partition("::")
        path, _, flavour = path.partition("[")
        assert (REPO / path).is_file(), unit
        assert not name or f"def {name}(" in (REPO / path).read_text(), unit
        assert not flavour or (path in SPLIT_BY_FLAVOUR and flavour.removesuffix("]") in FLAVOURS), unit
    assert unit_rank("tests/labs/test_labs_enginesim.py") == 0
    assert unit_rank("tests/rig/test_rig_map.py") == 1
    assert unit_rank("tests/analysis/test_analysis_state.py") == len(SLOW_UNITS)


def test_two_workers_keep_a_shared_module_fixture_on_one_worker(tmp_path: Path) -> None:
    """A real `pytest -n 2` with this conftest: the tests sharing a module fixture meet on one worker
    (the fixture runs once), the split tests go to the other; a labs file's flavour-parametrised module
    fixture runs once per flavour."""
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
    labs = tmp_path / "tests" / "labs"
    labs.mkdir()
    (labs / "test_sched_profile_lab.py").write_text(
        "\n".join(
            [
                "import os, time, pytest",
                "@pytest.fixture(scope='module', params=['sglang', 'vllm'])",
                "def labs(request):",
                f"    open({str(log)!r}, 'a').write('labs ' + request.param + '\\n')",
                "    return request.param",
                "def note(flavour):",
                "    time.sleep(0.3)",
                "    worker = os.environ['PYTEST_XDIST_WORKER']",
                f"    open({str(log)!r}, 'a').write(flavour + ' ' + worker + '\\n')",
                *(f"def test_{i}(labs): note(labs)" for i in ("a", "b", "c")),
                "def test_alone(): note('alone')",
            ]
        )
        + "\n"
    )
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
    # each flavour's module fixture ran once, and all three tests of a flavour met on one worker
    assert sorted(line for line in lines if line.startswith("labs ")) == ["labs sglang", "labs vllm"], lines
    for flavour in ("sglang", "vllm"):
        ran = [line.split()[1] for line in lines if line.startswith(f"{flavour} ")]
        assert len(ran) == 3 and len(set(ran)) == 1, (flavour, lines)
    assert len([line for line in lines if line.startswith("alone ")]) == 1, lines
