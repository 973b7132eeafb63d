"""build/calibrate.pyz: the one file the calibrate role ships to a node is complete and runs on its own.

The node runs it with the engine image's python (which has torch, not enginesim): the archive must
carry the package and its data files, and run from a directory far from the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from enginesim.calibrate import zipapp

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(zipapp.build(str(tmp_path_factory.mktemp("pyz") / "calibrate.pyz")))


def test_archive_holds_the_package_and_its_data(pyz: Path) -> None:
    names = set(zipfile.ZipFile(pyz).namelist())
    for needed in (
        "__main__.py",
        "enginesim/catalog.py",
        "enginesim/hwprofile.py",
        "enginesim/calibrate/__main__.py",
        "enginesim/calibrate/profile.py",
        "enginesim/data/hardware.json",
        "enginesim/data/models.json",
        "enginesim/data/measured/h200/raw.json",
    ):
        assert needed in names, needed
    assert not any("__pycache__" in n for n in names)
    assert pyz.stat().st_mode & stat.S_IXUSR


def test_a_python_without_enginesim_parses_flags_from_the_archive(pyz: Path, tmp_path: Path) -> None:
    """The system python has no enginesim installed: argument checks (catalogue lookups) come from the zip."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no /usr/bin/python3")
    probe = subprocess.run(
        [system, "-I", "-c", "import enginesim"], capture_output=True, timeout=30, cwd=tmp_path, check=False
    )
    assert probe.returncode != 0, "the system python must not have enginesim for this test to mean anything"
    r = subprocess.run(
        [system, "-I", str(pyz), "--out", str(tmp_path / "o"), "--base", "no-such-gpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 2
    assert "--base 'no-such-gpu': must be one of" in r.stderr and "h200" in r.stderr


def test_cpu_calibration_runs_from_the_archive(pyz: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    r = subprocess.run(
        [
            sys.executable,
            "-I",
            str(pyz),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--sections",
            "bandwidth,gemm",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((out / "profile.json").read_text())
    assert doc["device"] == "cpu" and doc["measured"]["mem_read_bytes_per_s"] > 0
    # Readable by others: a container writes as root, the node's login user fetches the file.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "profile.json").stat().st_mode) == 0o666 & ~umask
