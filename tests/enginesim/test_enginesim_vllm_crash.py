"""vLLM flavour: an injected engine crash ends serving at once, the way the real EngineCore dies.

Why: at a small time scale whole requests take microseconds, so a server that kept stepping during
the grace before its exit finished requests *after* logging its fatal error, and a quick-map case
on a crashed vLLM server was recorded as completed instead of SERVER_DEAD.
"""

from __future__ import annotations

import httpx

VLLM = ["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"]


def _complete(client: httpx.Client, url: str) -> httpx.Response:
    body = {"model": "Qwen/Qwen3-0.6B", "prompt": [300] * 32, "max_tokens": 8, "ignore_eos": True}
    return client.post(url + "/v1/completions", json=body, timeout=10)


def test_vllm_crash_fails_every_later_request_and_exits(start) -> None:
    srv = start([*VLLM, "--sim-crash-after", "1"], env={"ENGINESIM_TIME_SCALE": "0.001"})
    later: list[int | str] = []
    with httpx.Client() as client:  # one kept-alive connection: the later requests go out at once
        first = _complete(client, srv.url)
        assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 8
        for _ in range(3):
            try:
                later.append(_complete(client, srv.url).status_code)
            except httpx.TransportError:
                later.append("connection error")
    assert 200 not in later, later
    assert srv.proc.wait(5) == 1
    log = srv.text()
    assert "EngineCore encountered a fatal error." in log
    assert "vllm.v1.engine.exceptions.EngineDeadError" in log
