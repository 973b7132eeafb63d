"""Suite-wide collection order: the longest test files first, so two xdist workers finish together.

`make test` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`: every file goes whole to one
worker (the rig and playbook files run in file order and share module fixtures), and files are handed
out in the order below. Longest-first keeps a multi-minute file from starting last and running alone.
The figures are `--durations` sums per file on this 2-core box; a file not listed keeps its place
after them. Order inside a file never changes.
"""

from __future__ import annotations

import pytest

# Longest first (seconds of test time per file, measured with -n 2 under load; see tests/README.md).
SLOW_FILES = (
    "tests/rig/test_rig_map.py",
    "tests/rig/test_rig_calibrate.py",
    "tests/ansible/test_quick_map.py",
    "tests/ansible/test_vllm_flow.py",
    "tests/calibrate/test_calibrate_playbook.py",
)


def file_rank(nodeid: str) -> int:
    """Position of the test's file in SLOW_FILES; every other file ranks after them."""
    path = nodeid.split("::", 1)[0]
    return SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stable sort by file rank: slow files first, everything else in collection order."""
    items.sort(key=lambda item: file_rank(item.nodeid))
