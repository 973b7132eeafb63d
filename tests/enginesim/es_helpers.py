"""Helpers for the enginesim tests: spawn real server processes, wait for health, read SSE streams."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port as free_port  # re-exported for the tests of this folder

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "LC_ALL": "C.UTF-8", **(env or {})}
    full_env.setdefault("ENGINESIM_TIME_SCALE", "0.05")
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "enginesim", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=full_env,
        )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def stream_events(
    url: str, path: str, payload: dict, timeout: float = 60.0
) -> tuple[list[float], list[dict]]:
    """POST a streaming request; returns (seconds from send to each data event, parsed events)."""
    times: list[float] = []
    events: list[dict] = []
    with httpx.Client(timeout=timeout) as c:
        t0 = time.perf_counter()
        with c.stream("POST", url + path, json=payload) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                body = line[6:]
                if body == "[DONE]":
                    break
                times.append(time.perf_counter() - t0)
                events.append(json.loads(body))
    return times, events
