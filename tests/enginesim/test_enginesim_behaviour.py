"""Effects that must emerge from the scheduler and cost model, each checked on a real server process."""

from __future__ import annotations

import itertools
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from es_helpers import stream_events


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256, 32000) for _ in range(n)]


def _ttft(url: str, ids: list[int]) -> tuple[float, dict]:
    times, events = stream_events(
        url,
        "/generate",
        {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
    )
    return times[0], events[-1]["meta_info"]


def test_repeated_prompt_hits_radix_cache_and_lowers_ttft(start) -> None:
    srv = start(
        ["sglang", "--model-path", "meta-llama/Llama-2-7b-hf", "--sim-hardware", "a100-80g"],
        env={"ENGINESIM_TIME_SCALE": "1.0"},
    )
    assert httpx.post(srv.url + "/flush_cache").status_code == 200
    ids = _ids(2080, 1)
    cold, meta_cold = _ttft(srv.url, ids)
    warm, meta_warm = _ttft(srv.url, ids)
    assert meta_cold["cached_tokens"] == 0
    assert meta_warm["cached_tokens"] >= 2048
    assert warm < cold / 2, (cold, warm)


def _run_8_under_kv_cap(url: str, path: str, body_of) -> list[dict]:
    with ThreadPoolExecutor(8) as ex:
        futs = [
            ex.submit(lambda i=i: httpx.post(url + path, json=body_of(_ids(1024, 100 + i)), timeout=120))
            for i in range(8)
        ]
        return [f.result().json() for f in futs]


def test_sglang_kv_cap_retracts_and_all_finish(start) -> None:
    srv = start(
        ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--max-total-tokens", "4096", "--enable-metrics"],
        env={"ENGINESIM_TIME_SCALE": "1.0"},
    )
    outs = _run_8_under_kv_cap(
        srv.url,
        "/generate",
        lambda ids: {"input_ids": ids, "sampling_params": {"max_new_tokens": 512, "ignore_eos": True}},
    )
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [512] * 8
    assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
    metrics = httpx.get(srv.url + "/metrics").text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:num_retracted_requests_total{"))
    assert float(line.rsplit(" ", 1)[1]) > 0
    assert "KV cache pool is full. Retract requests. #retracted_reqs:" in srv.text()
    assert "KV Cache is allocated. #tokens: 4096," in srv.text()


def test_vllm_kv_cap_preempts_and_all_finish(start) -> None:
    srv = start(
        ["vllm", "serve", "Qwen/Qwen3-0.6B", "--num-gpu-blocks-override", "256", "--max-model-len", "2048"]
    )
    outs = _run_8_under_kv_cap(
        srv.url, "/v1/completions", lambda ids: {"prompt": ids, "max_tokens": 512, "ignore_eos": True}
    )
    assert [o["usage"]["completion_tokens"] for o in outs] == [512] * 8
    metrics = httpx.get(srv.url + "/metrics").text
    line = next(ln for ln in metrics.splitlines() if ln.startswith("vllm:num_preemptions_total{"))
    assert float(line.rsplit(" ", 1)[1]) > 0
    assert "GPU KV cache size: 4,096 tokens" in srv.text()


def _max_gap_with_injection(url: str, vllm: bool = False) -> float:
    """Largest inter-event gap of a decode stream while a 7,168-token prefill lands in the middle."""
    result: dict[str, list[float]] = {}

    def background() -> None:
        if vllm:
            body = {"prompt": _ids(256, 5), "stream": True, "max_tokens": 150, "ignore_eos": True}
        else:
            body = {
                "input_ids": _ids(256, 5),
                "stream": True,
                "sampling_params": {"max_new_tokens": 150, "ignore_eos": True},
            }
        result["t"], _ = stream_events(url, "/v1/completions" if vllm else "/generate", body)

    with ThreadPoolExecutor(2) as ex:
        bg = ex.submit(background)
        time.sleep(0.15)
        inj = ex.submit(
            lambda: httpx.post(
                url + ("/v1/completions" if vllm else "/generate"),
                timeout=60,
                json={"prompt": _ids(7168, 6), "max_tokens": 1, "ignore_eos": True}
                if vllm
                else {
                    "input_ids": _ids(7168, 6),
                    "sampling_params": {"max_new_tokens": 1, "ignore_eos": True},
                },
            )
        )
        assert inj.result().status_code == 200
        bg.result()
    t = result["t"]
    return max(b - a for a, b in itertools.pairwise(t))


def test_big_chunk_stalls_running_stream_more_than_small_chunk(start) -> None:
    common = [
        "sglang",
        "--model-path",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--sim-hardware",
        "h100",
        "--enable-mixed-chunk",
    ]
    env = {"ENGINESIM_TIME_SCALE": "1.0"}
    big = start([*common, "--chunked-prefill-size", "8192"], env=env)
    gap_big = _max_gap_with_injection(big.url)
    small = start([*common, "--chunked-prefill-size", "512"], env=env)
    gap_small = _max_gap_with_injection(small.url)
    assert gap_big > 3 * gap_small, (gap_big, gap_small)


def test_vllm_token_budget_bounds_the_stall_of_a_running_stream(start) -> None:
    common = [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--sim-hardware",
        "h100",
        "--max-model-len",
        "16384",
    ]
    env = {"ENGINESIM_TIME_SCALE": "1.0"}
    big = start([*common, "--max-num-batched-tokens", "8192"], env=env)
    gap_big = _max_gap_with_injection(big.url, vllm=True)
    small = start([*common, "--max-num-batched-tokens", "512"], env=env)
    gap_small = _max_gap_with_injection(small.url, vllm=True)
    assert gap_big > 3 * gap_small, (gap_big, gap_small)


def test_without_mixed_chunk_decode_stalls_for_the_whole_chunked_prefill(start) -> None:
    common = [
        "sglang",
        "--model-path",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--sim-hardware",
        "h100",
        "--chunked-prefill-size",
        "512",
    ]
    env = {"ENGINESIM_TIME_SCALE": "1.0"}
    separate = start(common, env=env)
    gap_separate = _max_gap_with_injection(separate.url)
    mixed = start([*common, "--enable-mixed-chunk"], env=env)
    gap_mixed = _max_gap_with_injection(mixed.url)
    assert gap_separate > 3 * gap_mixed, (gap_separate, gap_mixed)


def _decode_time(url: str) -> float:
    t, _ = stream_events(
        url,
        "/generate",
        {
            "input_ids": _ids(64, 9),
            "stream": True,
            "sampling_params": {"max_new_tokens": 101, "ignore_eos": True},
        },
    )
    return (t[-1] - t[0]) / 100


def test_cuda_graph_decode_faster_than_eager(start) -> None:
    env = {"ENGINESIM_TIME_SCALE": "3.0"}
    graph = start(["sglang", "--model-path", "Qwen/Qwen3-0.6B"], env=env)
    eager = start(["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--disable-cuda-graph"], env=env)
    t_graph, t_eager = _decode_time(graph.url), _decode_time(eager.url)
    assert t_eager > 2 * t_graph, (t_graph, t_eager)


def test_ngram_accepts_more_on_repetitive_prompt(start) -> None:
    srv = start(
        [
            "sglang",
            "--model-path",
            "Qwen/Qwen3-0.6B",
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            "8",
        ]
    )

    def accept_len(ids: list[int]) -> float:
        meta = httpx.post(
            srv.url + "/generate",
            timeout=60,
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}},
        ).json()["meta_info"]
        assert meta["completion_tokens"] == 256
        return meta["spec_accept_length"]

    repetitive = accept_len(_ids(16, 7) * 64)
    ordinary = accept_len(_ids(1024, 8))
    assert repetitive > 3.0
    assert repetitive > 2 * ordinary, (repetitive, ordinary)


def test_fp8_kv_doubles_capacity(start) -> None:
    base = start(["sglang", "--model-path", "Qwen/Qwen3-0.6B"])
    fp8 = start(["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--kv-cache-dtype", "fp8_e4m3"])
    n_base = httpx.get(base.url + "/server_info").json()["max_total_num_tokens"]
    n_fp8 = httpx.get(fp8.url + "/server_info").json()["max_total_num_tokens"]
    assert 1.9 < n_fp8 / n_base < 2.1
    assert f"KV Cache is allocated. #tokens: {n_fp8}," in fp8.text()
    vb = start(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"])
    vf = start(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096", "--kv-cache-dtype", "fp8"])

    def vllm_tokens(s) -> int:
        line = next(ln for ln in s.text().splitlines() if "GPU KV cache size:" in ln)
        return int(line.split("GPU KV cache size: ")[1].split(" ")[0].replace(",", ""))

    assert 1.9 < vllm_tokens(vf) / vllm_tokens(vb) < 2.1


def test_flush_cache_refused_while_a_request_runs(start) -> None:
    srv = start(["sglang", "--model-path", "Qwen/Qwen3-0.6B"], env={"ENGINESIM_TIME_SCALE": "1.0"})
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            httpx.post,
            srv.url + "/generate",
            timeout=60,
            json={"input_ids": _ids(32, 3), "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}},
        )
        time.sleep(0.2)
        busy = httpx.post(srv.url + "/flush_cache")
        assert fut.result().status_code == 200
    assert busy.status_code == 400
    assert httpx.post(srv.url + "/flush_cache").status_code == 200


def test_vllm_ngram_acceptance_follows_the_prompt(start) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
    common = ["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096", "--speculative-config", spec]

    def mean_accept_len(ids: list[int]) -> float:
        srv = start(common)
        out = httpx.post(
            srv.url + "/v1/completions",
            timeout=60,
            json={"prompt": ids, "max_tokens": 256, "ignore_eos": True},
        ).json()
        assert out["usage"]["completion_tokens"] == 256
        m = {
            ln.split("{")[0]: float(ln.rsplit(" ", 1)[1])
            for ln in httpx.get(srv.url + "/metrics").text.splitlines()
            if ln.startswith("vllm:spec_decode_num_") and "per_pos" not in ln
        }
        return 1 + m["vllm:spec_decode_num_accepted_tokens_total"] / max(
            m["vllm:spec_decode_num_drafts_total"], 1
        )

    repetitive = mean_accept_len(_ids(16, 7) * 64)
    ordinary = mean_accept_len(_ids(1024, 8))
    assert repetitive > 2.5
    assert repetitive > 1.5 * ordinary, (repetitive, ordinary)
