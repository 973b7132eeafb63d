"""pytest plugin for bench_test_suite.py: each test's wall time and CPU, one JSON line per test.

CPU is this worker's own plus that of every child it reaped meanwhile (an `ansible-playbook` and the
forks and modules under it), counted when the child is reaped: a run a fixture started and a later
test waited for counts in that test, so sum per file, not per test. A server a playbook started in
the background is re-parented to init and is not counted: the box-wide busy share covers it.

    QUICKMAP_CPU_ACCOUNTING_DIR=DIR pytest -p benchmarks.pytest_cpu_accounting ...
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out_dir = os.environ.get("QUICKMAP_CPU_ACCOUNTING_DIR")
    start = time.time()
    own0, children0 = _cpu_seconds()
    yield
    if not out_dir:
        return
    own1, children1 = _cpu_seconds()
    record = {
        "nodeid": item.nodeid,
        "start": start,
        "wall_s": time.time() - start,
        "cpu_own_s": own1 - own0,
        "cpu_children_s": children1 - children0,
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(out_dir, f"{worker}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
