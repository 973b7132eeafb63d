"""Prefill/decode disaggregation in enginesim: both engines' flags, the router/proxy forwarding, the KV
transfer priced as fixed + bytes / bandwidth, its evidence, and what a request sees when prefill dies."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from es_helpers import REPO, Server, free_port, spawn, wait_healthy

MODEL = "Qwen/Qwen3-0.6B"
RECEIVED = re.compile(r"KV received room=\S+ tokens=(\d+) bytes=(\d+) transfer_ms=([\d.]+)")


def _router(tmp: Path, args: list[str], port: int, servers: list[Server]) -> Server:
    srv = Server(spawn(args, tmp / f"{args[0]}.log"), port, tmp / f"{args[0]}.log")
    servers.append(srv)
    end = time.monotonic() + 20
    health = "/healthcheck" if args[0] == "vllm_proxy" else "/health"
    while time.monotonic() < end:
        try:
            if httpx.get(srv.url + health, timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError(f"{args[0]} not up")


@pytest.fixture
def pd(tmp_path: Path):
    """pd(flavour, link_gbps, fixed_ms) -> (prefill, decode, router) Servers; all stopped afterwards."""
    servers: list[Server] = []

    def _pd(flavour: str, gbps: float = 25.0, fixed_ms: float = 2.0) -> tuple[Server, Server, Server]:
        knobs = ["--sim-kv-link-gbps", str(gbps), "--sim-kv-transfer-fixed-ms", str(fixed_ms)]
        pp, dp, rp, bp = free_port(), free_port(), free_port(), free_port()
        if flavour == "sglang":
            head = ["sglang", "--model-path", MODEL, "--host", "127.0.0.1", "--enable-metrics", *knobs]
            pargs = [
                *head,
                "--port",
                str(pp),
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                str(bp),
            ]
            dargs = [*head, "--port", str(dp), "--disaggregation-mode", "decode"]
            rargs = [
                "sglang_router",
                "--pd-disaggregation",
                "--prefill",
                f"http://127.0.0.1:{pp}",
                str(bp),
                "--decode",
                f"http://127.0.0.1:{dp}",
                "--host",
                "127.0.0.1",
                "--port",
                str(rp),
            ]
        else:
            kv = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
            head = ["vllm", "serve", MODEL, "--host", "127.0.0.1", "--kv-transfer-config", kv, *knobs]
            pargs, dargs = [*head, "--port", str(pp)], [*head, "--port", str(dp)]
            rargs = [
                "vllm_proxy",
                "--port",
                str(rp),
                "--prefiller-host",
                "127.0.0.1",
                "--prefiller-port",
                str(pp),
                "--decoder-host",
                "127.0.0.1",
                "--decoder-port",
                str(dp),
            ]
        p = Server(spawn(pargs, tmp_path / "prefill.log"), pp, tmp_path / "prefill.log")
        d = Server(spawn(dargs, tmp_path / "decode.log"), dp, tmp_path / "decode.log")
        servers.extend([p, d])
        wait_healthy(p.url, p.proc)
        wait_healthy(d.url, d.proc)
        return p, d, _router(tmp_path, rargs, rp, servers)

    yield _pd
    for s in servers:
        s.stop()


def _completion(url: str, prompt: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_request_through_router_pays_the_priced_transfer(pd, flavour: str) -> None:
    p, d, r = pd(flavour, gbps=2.0, fixed_ms=5.0)
    short, long = _completion(r.url, "alpha " * 20), _completion(r.url, "alpha beta " * 400)
    assert short.status_code == long.status_code == 200, (short.text, long.text)
    assert short.json()["usage"]["completion_tokens"] == 8
    got = [tuple(map(float, m)) for m in RECEIVED.findall(d.text())]
    assert len(got) == 2, d.text()[-2000:]
    per_token = {b / t for t, b, _ in got}
    assert len(per_token) == 1  # bytes = prompt tokens x the model's KV bytes per token
    for _tokens, nbytes, ms in got:
        assert ms == pytest.approx(5.0 + nbytes / 2e9 * 1000, abs=0.002)
    assert got[1][1] > 10 * got[0][1]
    assert _metric(d.url, "enginesim:kv_transfers_total") == 2
    assert _metric(d.url, "enginesim:kv_transfer_bytes_total") == pytest.approx(got[0][1] + got[1][1])
    assert _metric(p.url, "enginesim:kv_transfers_total") == 2  # handed over on the prefill side too
    if flavour == "sglang":
        assert _metric(d.url, "sglang:kv_transfer_total_mb") == pytest.approx(got[1][1] / 1e6)


def test_a_slow_link_shows_in_the_latency_seen_through_the_router(pd) -> None:
    _, _, fast = pd("sglang", gbps=1000.0, fixed_ms=0.0)
    prompt = "alpha beta " * 1000
    t0 = time.perf_counter()
    assert _completion(fast.url, prompt, 2).status_code == 200
    fast_s = time.perf_counter() - t0
    _, d, slow = pd("sglang", gbps=0.02, fixed_ms=0.0)  # ~2k tokens x 112 KiB / 20 MB/s = ~11.5 emulated s
    t0 = time.perf_counter()
    assert _completion(slow.url, prompt, 2).status_code == 200
    slow_s = time.perf_counter() - t0
    ((_, _nbytes, ms),) = [tuple(map(float, m)) for m in RECEIVED.findall(d.text())]
    assert slow_s >= ms / 1000 * 0.05  # the transfer at the time scale (0.05) is inside the latency
    assert slow_s > fast_s + 0.3, (fast_s, slow_s)


@pytest.mark.parametrize("flavour", ["sglang", "vllm"])
def test_dead_prefill_fails_requests_through_the_router(pd, flavour: str) -> None:
    p, _d, r = pd(flavour)
    assert _completion(r.url, "alpha " * 20).status_code == 200
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(5)
    resp = _completion(r.url, "alpha " * 20)
    if flavour == "sglang":
        assert resp.status_code == 503 and "prefill server failed" in resp.json()["error"]
    else:
        assert resp.status_code == 500 and resp.text == "Internal Server Error"
    end = time.monotonic() + 5  # the router logs after it answered
    while "outcome=prefill_failed" not in r.text() and time.monotonic() < end:
        time.sleep(0.05)
    assert "outcome=prefill_failed" in r.text()
    assert httpx.get(r.url + "/enginesim/router_stats", timeout=5).json()["prefill_failed"] == 1


def test_decode_waiting_for_a_dead_prefill_fails_with_a_bootstrap_error(pd) -> None:
    _, d, _ = pd("sglang")
    dead = free_port()
    body = {
        "text": "alpha beta",
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": dead,
        "bootstrap_room": 7,
    }
    resp = httpx.post(d.url + "/generate", json=body, timeout=30)
    assert resp.status_code == 500 and "KV bootstrap" in resp.json()["message"]
    assert _metric(d.url, "sglang:num_bootstrap_failed_reqs_total") == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["vllm", "serve", MODEL, "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], "kv_role"),
        (["vllm", "serve", MODEL, "--kv-transfer-config", '{"kv_rolez":"kv_both"}'], "kv_rolez"),
        (["sglang", "--model-path", MODEL, "--disaggregation-mode", "both"], "--disaggregation-mode"),
        (["sglang", "--model-path", MODEL, "--disaggregation-bootstrap-port", "70000"], "70000"),
        (
            ["sglang_router", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"],
            "--pd-disagg",
        ),
        (
            ["sglang_router", "--pd-disaggregation", "--prefill", "127.0.0.1:1", "--decode", "http://h:2"],
            "HOST:PORT",
        ),
        (["vllm_proxy", "--prefiller-hosts", "a", "b", "--prefiller-ports", "1"], "must match"),
    ],
)
def test_bad_disaggregation_flags_are_refused_naming_them(args: list[str], needle: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "enginesim", *args], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2, out
    assert needle in out.stderr
