"""Session-wide hook: with QUICKMAP_SKIP_REPORT=FILE set, every skipped test (node id and reason) is
written to FILE as JSON when the session ends, for the skip gate (.ci/check_skips.py)."""

from __future__ import annotations

import json
import os

_SKIPS: list[dict] = []


def _reason(report) -> str:
    longrepr = report.longrepr  # for a skip: (file, line, "Skipped: reason")
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append({"nodeid": report.nodeid, "when": report.when, "reason": _reason(report)})


def pytest_collectreport(report) -> None:
    if report.skipped:  # a whole module skipped at import
        _SKIPS.append({"nodeid": report.nodeid, "when": "collect", "reason": _reason(report)})


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("QUICKMAP_SKIP_REPORT")
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"exitstatus": int(exitstatus), "skips": _SKIPS}, f, indent=1)
        os.replace(tmp, path)
