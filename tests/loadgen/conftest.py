"""Fixtures for loadgen tests (helpers live in lg_helpers.py, the fake server in fakeserver.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lg_helpers import run_loadgen


@pytest.fixture
def lg(tmp_path):
    def _run(args, **kw):
        return run_loadgen(args, tmp_path, **kw)

    return _run
