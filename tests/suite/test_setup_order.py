"""make test's set-up: what it builds before pytest starts, so the tests themselves only test."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_test_builds_the_sanity_environments_before_pytest_starts() -> None:
    """ansible-test's per-check virtual environments (about two minutes of pip on a fresh clone) are
    built by the set-up, not inside the sanity test that a pytest worker runs."""
    proc = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    prime = [i for i, line in enumerate(lines) if "collection_sanity.py" in line and "--prime-venvs" in line]
    pytest_run = [i for i, line in enumerate(lines) if "/pytest -q -ra -n" in line]
    assert prime and pytest_run and prime[0] < pytest_run[0], proc.stdout
