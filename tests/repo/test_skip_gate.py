"""The skip gate: a skipped test fails `make test` unless .ci/allowed-skips.txt allows it, by node id and
reason; the allow-list and every skip are printed each run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GATE = REPO / ".ci" / "check_skips.py"
ALLOW = REPO / ".ci" / "allowed-skips.txt"


def gate(report: Path, allow: Path = ALLOW) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(GATE), str(report), str(allow)], capture_output=True, text=True, timeout=60
    )


def session_report(tmp_path: Path, test_source: str) -> Path:
    """Run a real pytest session on ``test_source`` with the repo's skip hook; its skip report."""
    (tmp_path / "test_sample.py").write_text(test_source)
    report = tmp_path / "skips.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
        cwd=REPO, env=dict(os.environ, QUICKMAP_SKIP_REPORT=str(report)), capture_output=True, timeout=120,
    )  # fmt: skip
    return report


def test_a_skip_not_on_the_list_fails_and_is_named(tmp_path):
    report = session_report(
        tmp_path,
        "import pytest\ndef test_ok(): pass\ndef test_quiet(): pytest.skip('fixture file missing')\n",
    )
    cp = gate(report)
    assert cp.returncode == 1
    assert "NOT ALLOWED test_sample.py::test_quiet (call): fixture file missing" in cp.stdout
    assert "skips allowed by" in cp.stdout and "SO_TIMESTAMPNS is Linux-only" in cp.stdout  # list printed


def test_an_allowed_skip_passes_only_with_its_reason(tmp_path):
    allow = tmp_path / "allow.txt"
    allow.write_text("# why: a machine condition\ntest_sample.py::test_linux_only | is Linux-only\n")
    report = session_report(
        tmp_path,
        "import pytest\n"
        "@pytest.mark.skipif(True, reason='SO_TIMESTAMPNS is Linux-only')\ndef test_linux_only(): pass\n",
    )
    cp = gate(report, allow)
    assert cp.returncode == 0, cp.stdout
    assert "allowed     test_sample.py::test_linux_only (setup): SO_TIMESTAMPNS is Linux-only" in cp.stdout
    # the same test skipping for another reason is not covered by the entry
    report.write_text(json.dumps({"skips": [{"nodeid": "test_sample.py::test_linux_only", "when": "setup",
                                             "reason": "tool not installed"}]}))  # fmt: skip
    assert gate(report, allow).returncode == 1


def test_a_missing_report_or_a_malformed_list_fails(tmp_path):
    assert gate(tmp_path / "none.json").returncode == 1
    bad = tmp_path / "allow.txt"
    bad.write_text("tests/x.py::test_y no separator\n")
    (tmp_path / "r.json").write_text('{"skips": []}')
    cp = gate(tmp_path / "r.json", bad)
    assert cp.returncode != 0 and "expected 'NODEID-GLOB | REASON-REGEX'" in (cp.stdout + cp.stderr)


def test_the_allow_list_names_only_machine_conditions():
    """Every entry is explained by the comment block above it, and none allows a whole directory."""
    lines = ALLOW.read_text().splitlines()
    entries = [i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")]
    assert entries
    for i in entries:
        assert lines[i - 1].startswith("#"), f"entry without a why above it: {lines[i]!r}"
        glob = lines[i].split("|")[0].strip()
        assert ".py::" in glob, f"an entry must name a test file: {lines[i]!r}"
