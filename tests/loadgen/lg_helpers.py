"""Helpers for loadgen tests: run the real CLI as a process (a uniquely named module, so it never
collides with another test directory's conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_loadgen(args: list[str], tmp_path, timeout: float = 60.0, out: bool = True, cmd=None):
    """Run ``python -m loadgen ARGS``; returns (CompletedProcess, result dict or None)."""
    outf = os.path.join(str(tmp_path), "bench.json")
    full = list(args)
    if out and "--output-file" not in full:
        full += ["--output-file", outf]
    base = cmd or [sys.executable, "-m", "loadgen"]
    cp = subprocess.run(
        base + full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    res = None
    if out and os.path.exists(outf):
        with open(outf) as f:
            res = json.load(f)
    return cp, res
