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


def test_a_peer_client_crash_is_named_not_a_traceback(tmp_path, monkeypatch) -> None:
    """bench_loadgen goes on with the other clients and names the one that died (httpx at C=1024 did)."""
    import pytest

    from benchmarks import loadgen_clients

    dying = tmp_path / "dying_client.py"
    dying.write_text("import sys\nsys.stderr.write('httpx.ReadError: connection reset\\n')\nsys.exit(3)\n")
    monkeypatch.setattr(loadgen_clients, "HERE", str(dying))
    clients = loadgen_clients.Clients(tmp=str(tmp_path))
    with pytest.raises(loadgen_clients.ClientFailed, match=r"httpx at C=1024 exited 3: httpx.ReadError"):
        clients.run_baseline("httpx", 1, loadgen_clients.Workload(1024, 4096, 128))
