"""Fixtures for the Ansible integration tests: real playbook runs on inventory/local (enginesim)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .runner import base_extravars, free_port, kill_recorded_servers, zipapp_path

# Small and fast, but every phase real: enginesim at 1/50 of real time, a short A/B.
FAST: dict[str, Any] = {
    "engine_env": {"ENGINESIM_TIME_SCALE": "0.02"},
    # Main phase ~5 s on a busy 2-core box: the injection (delay + ~1-2 s of Ansible) must land inside it.
    "mixed_decode": {"isl": 512, "osl": 1024, "concurrency": 32, "num_prompts": 768, "warmup": 1},
    "mixed_injection_delay_s": 0.5,
    "engine_start_timeout_s": 60,
}


@pytest.fixture(scope="session")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zipapp_path(tmp_path_factory.mktemp("zipapp"))


@pytest.fixture
def run_env(tmp_path: Path, pyz: Path) -> Iterator[dict[str, Any]]:
    """Isolated results root + free port; after the test, any server it left is stopped by PID."""
    results = tmp_path / "results"
    port = free_port()
    ev = base_extravars(results, pyz, port, **FAST)
    yield {"results": results, "port": port, "extravars": ev, "tmp": tmp_path}
    kill_recorded_servers(results)


def port_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
