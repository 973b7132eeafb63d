"""Start real enginesim server processes on free 127.0.0.1 ports and stop them by PID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from es_helpers import Server, free_port, spawn, wait_healthy


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    """start(flavour_args, env=None, wait=True) -> Server; every server is stopped after the test."""
    servers: list[Server] = []

    def _start(
        args: list[str], env: dict[str, str] | None = None, wait: bool = True, port: int | None = None
    ) -> Server:
        port = port or free_port()
        log = tmp_path / f"server_{len(servers)}.log"
        if args[0] == "sglang":
            full = [*args, "--host", "127.0.0.1", "--port", str(port)]
        else:
            full = [*args, "--host", "127.0.0.1", "--port", str(port)]
        srv = Server(spawn(full, log, env), port, log)
        servers.append(srv)
        if wait:
            wait_healthy(srv.url, srv.proc)
        return srv

    yield _start
    for s in servers:
        s.stop()
