"""`ansible-playbook quick_map.yml --tags calibrate` on inventory/local: the process runtime, the CPU path.

The real playbook, role, zipapp, calibration program (torch on this CPU) and gate module; only the results
root and the calibration's size (two sections, quick) are overridden. The CPU profile must come back
labelled device=cpu and be recorded, never judged as a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from enginesim.calibrate import zipapp

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SMALL = {"calibrate_sections": ["bandwidth", "gemm"], "calibrate_quick": True}


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = REPO / "build" / "calibrate.pyz"
    if built.is_file():
        return built
    return Path(zipapp.build(str(tmp_path_factory.mktemp("bin") / "calibrate.pyz")))


def playbook(
    results: Path, pyz: Path, *args: str, extra: dict | None = None
) -> subprocess.CompletedProcess[str]:
    ev = {"quickmap_results_dir": str(results), "calibrate_pyz": str(pyz), **SMALL, **(extra or {})}
    env = {
        **os.environ,
        "LC_ALL": "C.UTF-8",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "quick_map.yml", "-e", json.dumps(ev), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_cpu_calibration_is_recorded_and_never_gated_as_a_gpu(tmp_path: Path, pyz: Path) -> None:
    results = tmp_path / "results"
    proc = playbook(results, pyz, "--tags", "calibrate", "-e", "run_id=cal1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    cal = results / "cal1" / "calibration"
    doc = json.loads((cal / "localhost" / "cpu" / "profile.json").read_text())
    assert doc["device"] == "cpu" and doc["measured"]["mem_read_bytes_per_s"] > 0
    assert (cal / "localhost" / "cpu" / "exit_code").read_text().strip() == "0"
    cmd = (cal / "localhost" / "calibrate_cmd.txt").read_text()
    assert "/cal1/bin/calibrate.pyz --out" in cmd and "--device cpu --sections bandwidth,gemm --quick" in cmd
    gate = json.loads((cal / "gate.json").read_text())
    assert gate["passed"] is True and gate["gated"] == 0 and gate["not_gated"] == 1
    assert gate["rows"][0]["state"] == "not_gated"
    assert "no GPU judged; 1 CPU profile(s) recorded, not gated" in proc.stdout
    # A second calibration into the same run is refused before anything runs.
    again = playbook(results, pyz, "--tags", "calibrate", "-e", "run_id=cal1")
    assert again.returncode != 0
    assert f"{cal} already exists (rule: measurements are never overwritten" in again.stdout


def test_check_prints_the_command_and_writes_nothing(tmp_path: Path, pyz: Path) -> None:
    results = tmp_path / "results"
    proc = playbook(results, pyz, "--tags", "calibrate", "--check", "-e", "run_id=calchk")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "calibrate.pyz --out" in proc.stdout and "--device cpu" in proc.stdout
    assert not (results / "calchk" / "calibration").exists()


def test_plain_map_never_calibrates() -> None:
    """The import is tagged `never`: only --tags calibrate (or preflight_gpu_health) runs it."""
    env = {**os.environ, "LC_ALL": "C.UTF-8", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    listing = [
        subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "quick_map.yml", "--list-tasks", *tags],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=True,
        ).stdout
        for tags in ([], ["--tags", "calibrate"])
    ]  # fmt: skip
    assert "Calibrate | run the calibration" not in listing[0]
    assert "Calibrate | run the calibration" in listing[1]


def test_timeout_fails_the_gate_with_the_evidence(tmp_path: Path, pyz: Path) -> None:
    results = tmp_path / "results"
    proc = playbook(
        results, pyz, "--tags", "calibrate", "-e", "run_id=calto",
        extra={"calibrate_timeout_s": 1, "calibrate_sections": ["bandwidth", "gemm", "model"]},
    )  # fmt: skip
    assert proc.returncode != 0
    cpu = results / "calto" / "calibration" / "localhost" / "cpu"
    assert (cpu / "exit_code").read_text().strip() == "timeout"
    assert "GPU health gate failed closed" in proc.stdout
    assert "localhost CPU: no profile (" in proc.stdout and "exit timeout" in proc.stdout


def test_a_gpu_run_without_nvidia_smi_fails_naming_the_node(tmp_path: Path, pyz: Path) -> None:
    results = tmp_path / "results"
    proc = playbook(
        results, pyz, "--tags", "calibrate", "-e", "run_id=calgpu",
        extra={"calibrate_device": "cuda", "calibrate_nvidia_smi": str(tmp_path / "no-nvidia-smi")},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "localhost: " in proc.stdout and "--query-gpu=index,name gave rc=" in proc.stdout
    assert "(rule: a GPU node lists its GPUs as 'index, name')" in proc.stdout
    assert not (results / "calgpu" / "calibration").exists()


def test_a_value_that_would_reach_the_shell_is_refused_before_anything_runs(
    tmp_path: Path, pyz: Path
) -> None:
    results = tmp_path / "results"
    proc = playbook(
        results, pyz, "--tags", "calibrate", "-e", "run_id=calbad",
        extra={"calibrate_image": "img:1\ntouch /tmp/pwned", "calibrate_runtime": "docker"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert 'calibrate_image="img:1\\ntouch /tmp/pwned" (rule: an image reference' in proc.stdout
    assert not (results / "calbad" / "calibration").exists()
