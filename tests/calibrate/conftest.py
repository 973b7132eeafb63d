"""Paths of the committed H200 measurement, shared by the calibrate tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "enginesim" / "data" / "measured" / "h200"


@pytest.fixture
def measured_dir() -> Path:
    return MEASURED
