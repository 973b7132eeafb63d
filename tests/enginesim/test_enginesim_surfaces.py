"""Command lines, HTTP surfaces, bad input and fault injection, against real server processes."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from es_helpers import REPO, stream_events

SGL = ["sglang", "--model-path", "Qwen/Qwen3-0.6B"]


def _run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "enginesim", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_cli_refuses_unknown_and_malformed_flags_naming_them() -> None:
    r = _run_cli([*SGL, "--bogus-flag", "1"])
    assert r.returncode == 2 and "unrecognized arguments: --bogus-flag" in r.stderr
    r = _run_cli([*SGL, "--port", "abc"])
    assert r.returncode == 2 and "argument --port: invalid" in r.stderr and "'abc'" in r.stderr
    r = _run_cli(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-num-seqs", "0"])
    assert r.returncode == 2 and "--max-num-seqs" in r.stderr
    r = _run_cli(["vllm", "serve", "Qwen/Qwen3-0.6B", "--no-such-thing"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-thing" in r.stderr
    r = _run_cli(["vllm", "serve", "Qwen/Qwen3-0.6B", "--speculative-config", "{not json"])
    assert r.returncode == 2 and "--speculative-config" in r.stderr
    r = _run_cli(SGL, env={"ENGINESIM_TIME_SCALE": "-1"})
    assert r.returncode == 2 and "ENGINESIM_TIME_SCALE" in r.stderr and "> 0" in r.stderr
    r = _run_cli(["sglang", "--model-path", "no/such-model"])
    assert r.returncode == 2 and "no/such-model" in r.stderr
    r = _run_cli([*SGL, "--nnodes", "2", "--node-rank", "1"])
    assert r.returncode == 2 and "--dist-init-addr" in r.stderr


def test_bad_input_gets_each_engines_status_and_body_and_server_survives(start) -> None:
    sgl = start([*SGL, "--context-length", "4096"])
    vll = start(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"])
    r = httpx.post(sgl.url + "/generate", content=b"{not json")
    assert r.status_code == 400 and r.json()["object"] == "error" and r.json()["code"] == 400
    r = httpx.post(sgl.url + "/generate", json={"input_ids": [300] * 5000})
    assert r.status_code == 400 and "longer than the model's context length" in r.json()["message"]
    r = httpx.post(
        sgl.url + "/generate", json={"input_ids": [300] * 100, "sampling_params": {"max_new_tokens": 4000}}
    )
    assert r.status_code == 400 and "maximum context length" in r.json()["message"]
    r = httpx.post(sgl.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokenz": 4}})
    assert r.status_code == 400 and "max_new_tokenz" in r.json()["message"]
    r = httpx.post(sgl.url + "/generate", json={"input_ids": [151936]})
    assert r.status_code == 400
    r = httpx.post(sgl.url + "/generate", json={"sampling_params": {}})
    assert r.status_code == 400
    r = httpx.post(vll.url + "/v1/completions", content=b"[1,2")
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.post(vll.url + "/v1/completions", json={"prompt": [300] * 4000, "max_tokens": 200})
    assert r.status_code == 400 and "maximum context length is 4096" in r.json()["error"]["message"]
    r = httpx.post(vll.url + "/v1/completions", json={"model": "other", "prompt": "hi"})
    assert r.status_code == 404
    assert httpx.get(vll.url + "/nope").status_code == 404
    assert httpx.get(sgl.url + "/health").status_code == 200
    assert httpx.get(vll.url + "/health").status_code == 200


def test_metrics_and_dev_endpoints_are_gated_like_the_engines(start) -> None:
    plain = start(SGL)
    metr = start([*SGL, "--enable-metrics"])
    vll = start(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"])
    dev = start(
        ["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"], env={"VLLM_SERVER_DEV_MODE": "1"}
    )
    assert httpx.get(plain.url + "/metrics").status_code == 404
    assert "sglang:num_running_reqs{" in httpx.get(metr.url + "/metrics").text
    assert "vllm:num_requests_running{" in httpx.get(vll.url + "/metrics").text
    assert httpx.post(vll.url + "/reset_prefix_cache").status_code == 404
    assert httpx.post(dev.url + "/reset_prefix_cache").status_code == 200
    info = httpx.get(plain.url + "/get_server_info").json()
    assert info["max_total_num_tokens"] > 0 and "sched_lag_ms" in info["enginesim"]
    assert httpx.get(vll.url + "/version").json()["version"]
    toks = httpx.post(vll.url + "/tokenize", json={"prompt": "hello world"}).json()
    assert toks["count"] == len(toks["tokens"])
    models = httpx.get(vll.url + "/v1/models").json()
    assert models["data"][0]["id"] == "Qwen/Qwen3-0.6B"


def test_stream_formats_cumulative_text_and_usage_chunk(start) -> None:
    srv = start(SGL)
    _, events = stream_events(
        srv.url,
        "/generate",
        {
            "text": "the cat sat on the mat",
            "stream": True,
            "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
        },
    )
    texts = [e["text"] for e in events]
    assert len(events) == 6 and all(texts[i + 1].startswith(texts[i]) for i in range(5))
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert "e2e_latency" in events[-1]["meta_info"] and "e2e_latency" not in events[0]["meta_info"]
    _, chunks = stream_events(
        srv.url,
        "/v1/completions",
        {
            "prompt": [300, 301, 302],
            "max_tokens": 5,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_queue_time_is_real_when_slots_are_full(start) -> None:
    srv = start(
        [*SGL, "--max-running-requests", "1", "--enable-metrics"], env={"ENGINESIM_TIME_SCALE": "1.0"}
    )
    body = {"input_ids": [300] * 16, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with ThreadPoolExecutor(2) as ex:
        a = ex.submit(httpx.post, srv.url + "/generate", json=body, timeout=30)
        time.sleep(0.02)
        b = ex.submit(httpx.post, srv.url + "/generate", json=body, timeout=30)
        first, second = a.result().json()["meta_info"], b.result().json()["meta_info"]
    # whichever reached the server second waited for the other's whole run in the queue
    waited, ran = sorted([first, second], key=lambda m: m["queue_time"])[::-1]
    assert waited["queue_time"] > 0.3 * ran["e2e_latency"] > 0.1
    assert ran["queue_time"] < 0.05


def test_fault_injection_oom_crash_slow_start_hang(start) -> None:
    oom = _run_cli(SGL, env={"ENGINESIM_OOM_AT_START": "1"})
    assert oom.returncode == 1 and "torch.OutOfMemoryError: CUDA out of memory." in oom.stdout
    crash = start([*SGL, "--sim-crash-after", "2"])
    for _ in range(2):
        httpx.post(
            crash.url + "/generate", json={"input_ids": [300], "sampling_params": {"max_new_tokens": 2}}
        )
    assert crash.proc.wait(5) == 1
    slow = start(SGL, env={"ENGINESIM_START_DELAY_S": "1.0"}, wait=False)
    time.sleep(0.6)
    try:
        early = httpx.get(slow.url + "/health").status_code
    except httpx.HTTPError:
        early = "down"
    assert early != 200
    hang = start([*SGL, "--sim-hang-after", "1"], env={"SGLANG_HEALTH_CHECK_TIMEOUT": "0.5"})
    httpx.post(hang.url + "/generate", json={"input_ids": [300], "sampling_params": {"max_new_tokens": 2}})
    try:
        httpx.post(
            hang.url + "/generate",
            json={"input_ids": [300], "sampling_params": {"max_new_tokens": 2}},
            timeout=1.0,
        )
        hung = False
    except httpx.ReadTimeout:
        hung = True
    assert hung
    assert httpx.get(hang.url + "/health", timeout=5).status_code == 503


def _counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_prompt_tokens_count_whole_prompts_cached_part_included(start) -> None:
    """SGLang's and vLLM's `prompt_tokens_total` count each request's whole prompt once (SGLang's
    TokenizerMetricsCollector at finish, vLLM's IterationStats at the first token), cache hits included;
    the cached part has its own counter. A client reading the counter learns what was sent."""
    prompt = list(range(300, 300 + 512))
    for args, name, cached in (
        ([*SGL, "--enable-metrics"], "sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
        (["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"], "vllm:prompt_tokens_total",
         "vllm:prefix_cache_hits_total"),
    ):  # fmt: skip
        srv = start(args)
        before = httpx.get(srv.url + "/metrics").text
        for _ in range(2):  # the second one hits the prefix cache
            body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            r = httpx.post(srv.url + "/v1/completions", json=body)
            assert r.status_code == 200, r.text
        after = httpx.get(srv.url + "/metrics").text
        assert _counter(after, cached) - _counter(before, cached) >= 256, (name, after)
        assert _counter(after, name) - _counter(before, name) == 2 * len(prompt), name
