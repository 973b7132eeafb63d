"""`make bench` names a missed target only if the benchmark's exit status says so."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_enginesim_fails_below_its_target(capsys) -> None:
    bench = _load("bench_enginesim")
    assert bench.verdict(49_999.0, 50_000.0) == 1
    assert "MISSED" in capsys.readouterr().out
    assert bench.verdict(50_000.0, 50_000.0) == 0
