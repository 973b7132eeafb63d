"""Start real emulated engine processes on free 127.0.0.1 ports and stop them by PID (calibrate tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def engines(runs: list[list[str]], log_dir: Path, env: dict[str, str] | None = None) -> Iterator[list[Any]]:
    """Start `python -m enginesim ARGS` for each entry of `runs`; stop every one that is still ours."""
    full_env = {**os.environ, "LC_ALL": "C.UTF-8", "ENGINESIM_TIME_SCALE": "0.05", **(env or {})}
    full_env.pop("ENGINESIM_HARDWARE", None)
    procs = []
    try:
        for i, args in enumerate(runs):
            with open(log_dir / f"engine{i}.log", "wb") as f:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "enginesim", *args],
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        cwd=REPO,
                        env=full_env,
                    )
                )
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(5)


def ready_info(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> dict[str, Any]:
    """/server_info once the server says ready (SGLang flavour); raises with the exit code otherwise."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}")
        try:
            r = httpx.get(url + "/health", timeout=2)
            if r.status_code == 200:
                return httpx.get(url + "/server_info", timeout=2).json()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout} s")
