"""Data-parallel ranks (`--dp-size` / `--data-parallel-size`): N independent schedulers behind one
endpoint, in the live server and in the replay."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enginesim import catalog, cli, replay
from enginesim.capacity import compute

MODEL = "Qwen/Qwen3-0.6B"
SGL = ["sglang", "--model-path", MODEL]
VLLM = ["vllm", "serve", MODEL]


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def _by(samples: dict, label: str, **match: str) -> dict[str, float]:
    return {
        dict(k)[label]: v for k, v in samples.items() if all(dict(k).get(m) == x for m, x in match.items())
    }


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([*SGL, "--dp-size", "4", "--tp-size", "4"], "--dp-size 4 x --tp-size 4 = 16 GPUs, but the emulated"),
        (
            [*VLLM, "--data-parallel-size", "3", "--tensor-parallel-size", "4"],
            "--data-parallel-size 3 x --tensor-parallel-size 4 = 12 GPUs, but the emulated node has 8",
        ),
        ([*SGL, "--dp-size", "2", "--load-balance-method", "shortest_queue"], "emulates round_robin only"),
        ([*SGL, "--dp-size", "2", "--enable-dp-attention"], "DP attention"),
    ],
)  # fmt: skip
def test_dp_times_tp_beyond_the_node_is_refused_naming_values_and_rule(argv, needle, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse(argv, {})
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_dp_times_tp_that_fits_is_accepted() -> None:
    assert cli.parse([*SGL, "--dp-size", "2", "--tp-size", "4"], {}).tp == 4
    assert cli.parse([*VLLM, "--data-parallel-size", "8"], {}).raw["data_parallel_size"] == 8


@pytest.mark.parametrize("head", [SGL, VLLM])
def test_replay_dp2_doubles_saturated_decode_throughput(head: list[str]) -> None:
    """Decode-bound (32 in, 256 out), every rank at its batch limit (32 running): two ranks at TP 1
    give about twice the output throughput of one, and each request still sees one rank's TPOT."""
    cap = ["--max-running-requests", "32"] if head is SGL else ["--max-num-seqs", "32"]
    dp = "--dp-size" if head is SGL else "--data-parallel-size"
    w = replay.Workload(isl=32, osl=256, concurrency=64, num_prompts=128)
    one = replay.run(cli.parse([*head, *cap], {}), w)
    two = replay.run(cli.parse([*head, *cap, dp, "2"], {}), w)
    assert one["completed"] == two["completed"] == 128
    ratio = two["output_throughput"] / one["output_throughput"]
    assert 1.8 <= ratio <= 2.05, ratio
    assert two["median_tpot_ms"] == pytest.approx(one["median_tpot_ms"], rel=0.1)


def test_replay_round_robin_puts_two_requests_on_two_ranks() -> None:
    """Two long prompts sent together: on one rank they share a prefill step (the second waits for the
    first's chunk), on two ranks each prefills alone, so both TTFTs are the lone-request TTFT."""
    w = replay.Workload(isl=6000, osl=2, concurrency=2, num_prompts=2)
    alone = replay.run(cli.parse(SGL, {}), replay.Workload(isl=6000, osl=2, concurrency=1, num_prompts=1))
    one = replay.run(cli.parse(SGL, {}), w)
    two = replay.run(cli.parse([*SGL, "--dp-size", "2"], {}), w)
    assert one["p99_ttft_ms"] > 1.5 * alone["median_ttft_ms"]
    assert two["p99_ttft_ms"] == pytest.approx(alone["median_ttft_ms"], rel=0.02)


# real time: each request decodes 256 tokens (~1 s), so the second arrives while the first runs
REAL_TIME = {"ENGINESIM_TIME_SCALE": "1"}


def _post_two(url: str, path: str, bodies: list[dict]) -> None:
    """Both requests in flight at once: clients made first, sends released together."""
    clients = [httpx.Client(timeout=60) for _ in bodies]
    go = threading.Barrier(len(bodies))

    def send(i: int) -> httpx.Response:
        go.wait()
        return clients[i].post(url + path, json=bodies[i])

    try:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            for r in pool.map(send, range(len(bodies))):
                assert r.status_code == 200, r.text
    finally:
        for c in clients:
            c.close()


def test_live_sglang_two_concurrent_requests_land_on_two_ranks_each_with_its_own_kv(start) -> None:
    srv = start([*SGL, "--dp-size", "2", "--enable-metrics"], env=REAL_TIME)
    _post_two(
        srv.url,
        "/generate",
        [
            {"input_ids": [t] * 500, "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
            for t in (300, 301)
        ],
    )
    text = httpx.get(srv.url + "/metrics").text
    prefill = _by(_samples(text, "sglang:realtime_tokens_total"), "dp_rank", mode="prefill_compute")
    assert set(prefill) == {"0", "1"}
    assert min(prefill.values()) >= 500, prefill  # one 500-token prompt on each rank
    # each rank has the KV pool of one TP=1 replica, and prints it with its own prefix
    tokens = compute(
        cli.parse(SGL, {}), catalog.load_model(MODEL), catalog.load_hardware("h200", None)
    ).tokens
    assert _by(_samples(text, "sglang:max_total_num_tokens"), "dp_rank") == {"0": tokens, "1": tokens}
    log = srv.text()
    for rank in (0, 1):
        assert f" DP{rank}] KV Cache is allocated. #tokens: {tokens}," in log
    # the tokenizer's series stay one per server: both requests counted once
    assert _samples(text, "sglang:num_requests_total") == {(("model_name", MODEL),): 2.0}


def test_live_vllm_dispatches_to_the_least_loaded_engine_each_with_its_own_kv(start) -> None:
    srv = start([*VLLM, "--data-parallel-size", "2", "--max-model-len", "4096"], env=REAL_TIME)
    _post_two(
        srv.url,
        "/v1/completions",
        [{"model": MODEL, "prompt": [t] * 500, "max_tokens": 256, "ignore_eos": True} for t in (300, 301)],
    )
    text = httpx.get(srv.url + "/metrics").text
    prompt = _by(_samples(text, "vllm:prompt_tokens_total"), "engine")
    assert set(prompt) == {"0", "1"} and min(prompt.values()) >= 500, prompt
    blocks = _by(_samples(text, "vllm:cache_config_info"), "num_gpu_blocks")
    assert len(blocks) == 1  # one pool size, both engines
    info = _samples(text, "vllm:cache_config_info")
    assert sorted(dict(k)["engine"] for k in info) == ["0", "1"]
    log = srv.text()
    assert "(EngineCore_DP1 pid=" in log and "GPU KV cache size" in log
    assert any("EngineCore_DP1" in ln and "GPU KV cache size" in ln for ln in log.splitlines())


def test_live_idle_rank_reads_its_request_while_another_rank_steps(start) -> None:
    """One rank decodes back-to-back short steps; a request for the other rank arriving meanwhile gets
    its first token after about one prefill step, not after the busy rank's last step."""
    srv = start([*SGL, "--dp-size", "2"], env=REAL_TIME)
    long_body = {"input_ids": [300] * 32, "sampling_params": {"max_new_tokens": 600, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(httpx.post, srv.url + "/generate", json=long_body, timeout=60)
        time.sleep(0.3)  # rank 0 is decoding now; round robin sends the next request to rank 1
        t0 = time.perf_counter()
        r = httpx.post(
            srv.url + "/generate",
            json={"input_ids": [301] * 1024, "sampling_params": {"max_new_tokens": 1}},
            timeout=60,
        )
        short_s = time.perf_counter() - t0
        assert r.status_code == 200 and not busy.done(), "the long request should still be decoding"
        assert busy.result().status_code == 200
    assert short_s < 0.25, short_s
