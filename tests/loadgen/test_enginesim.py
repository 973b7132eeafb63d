"""loadgen against the engine emulator (python -m enginesim): real process, real HTTP surfaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from lg_helpers import ROOT

from tests.ports import free_port as _free_port


def _start(tmp_path_factory, args: list[str], env: dict | None = None):
    port = _free_port()
    log = open(tmp_path_factory.mktemp("es") / "server.log", "w")  # noqa: SIM115 - closed below
    p = subprocess.Popen(
        [sys.executable, "-m", "enginesim", *args, "--port", str(port), "--sim-time-scale", "0.05"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"enginesim did not become healthy (exit {p.poll()})")
            time.sleep(0.3)
        yield url
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from _start(tmp_path_factory, ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--enable-metrics"])


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory):
    # /reset_prefix_cache exists only in vLLM's dev mode
    yield from _start(tmp_path_factory, ["vllm", "serve", "Qwen/Qwen3-0.6B"], {"VLLM_SERVER_DEV_MODE": "1"})


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_backends_against_enginesim(lg, engine, backend):
    cp, res = lg(
        [
            "--backend",
            backend,
            "--base-url",
            engine,
            "--num-prompts",
            "12",
            "--max-concurrency",
            "4",
            "--random-input-len",
            "64",
            "--random-output-len",
            "24",
            "--random-range-ratio",
            "1",
            "--scrape-metrics",
        ]
    )
    assert cp.returncode == 0, cp.stderr
    assert res["completed"] == 12 and res["failed"] == 0
    assert res["total_output_tokens"] == 12 * 24  # ignore_eos: the exact budget
    assert all(r["tokens_source"] == "server" for r in res["requests"])
    if backend != "sglang-oai-chat":
        assert res["total_input_tokens"] == 12 * 64  # token-id prompts: exact length
    d = res["server_metrics"]["delta"]
    assert d["sglang:num_requests_total"] == 12
    assert d["sglang:generation_tokens_total"] == 12 * 24
    assert res["mean_ttft_ms"] > 0 and res["mean_itl_ms"] is not None


def test_prefix_cache_hits_after_flush(lg, engine):
    # 2 groups x 4 prompts sharing a 256-token prefix, one at a time: after the flush, the first of
    # each group misses and the other three hit the whole prefix
    cp, res = lg(
        [
            "--backend",
            "sglang",
            "--base-url",
            engine,
            "--dataset-name",
            "shared-prefix",
            "--gsp-num-groups",
            "2",
            "--gsp-prompts-per-group",
            "4",
            "--gsp-system-prompt-len",
            "256",
            "--gsp-question-len",
            "32",
            "--gsp-output-len",
            "8",
            "--max-concurrency",
            "1",
            "--flush-cache",
            "--scrape-metrics",
        ]
    )
    assert cp.returncode == 0, cp.stderr
    assert "/flush_cache succeeded" in cp.stdout
    cached = [r["cached_tokens"] for r in sorted(res["requests"], key=lambda r: r["index"])]
    assert cached[:2] == [0, 0] and all(c >= 256 for c in cached[2:])
    assert res["server_metrics"]["delta"]["sglang:cached_tokens_total"] == sum(cached)


@pytest.mark.parametrize("backend", ["vllm", "vllm-chat"])
def test_vllm_backends_against_enginesim(lg, vllm_engine, backend):
    cp, res = lg(
        [
            "--backend",
            backend,
            "--base-url",
            vllm_engine,
            "--num-prompts",
            "8",
            "--max-concurrency",
            "4",
            "--random-input-len",
            "64",
            "--random-output-len",
            "16",
            "--random-range-ratio",
            "1",
            "--flush-cache",
            "--scrape-metrics",
        ]
    )
    assert cp.returncode == 0, cp.stderr
    assert "/reset_prefix_cache succeeded" in cp.stdout
    assert res["completed"] == 8 and res["total_output_tokens"] == 8 * 16
    d = res["server_metrics"]["delta"]
    assert d["vllm:generation_tokens_total"] == 8 * 16
    assert d["vllm:request_success_total"] == 8
    # the prefix cache was queried for exactly the prompt tokens loadgen recorded from usage
    assert d["vllm:prefix_cache_queries_total"] == res["total_input_tokens"]
    if backend == "vllm":  # token ids: exact lengths, nothing cached after the reset
        assert res["total_input_tokens"] == 8 * 64
        assert d["vllm:prompt_tokens_total"] == 8 * 64
