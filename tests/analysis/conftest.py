"""Make sure ``import analysis`` is the package, not this tests/analysis folder.

pytest's default (prepend) import mode puts ``tests/`` on sys.path when it collects a package
like ``tests/rig``; ``tests/analysis`` (no __init__.py) would then shadow the real package as a
namespace package. Putting the repository root first avoids that.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))
_mod = sys.modules.get("analysis")
if _mod is not None and getattr(_mod, "__file__", None) is None:
    del sys.modules["analysis"]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run ``python -m analysis`` in-process: returns (exit code, stdout, stderr)."""
    from analysis.__main__ import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
