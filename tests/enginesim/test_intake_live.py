"""The live engine's intake latency, measured from the socket: only a prompt sent as text pays the
engine's tokenisation (per prompt token); token ids (as loadgen sends them) pay the fixed part alone."""

from __future__ import annotations

import statistics

import httpx
from es_helpers import stream_events

from enginesim import catalog

SCALE = 10.0
FLAGS = ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--cuda-graph-max-bs", "64", "--disable-radix-cache"]


def _ttft(url: str, path: str, payload: dict) -> tuple[float, int]:
    """Seconds to the first event and the prompt length the server counted."""
    times, events = stream_events(url, path, {**payload, "stream": True})
    usage = events[-1].get("meta_info") or events[-1].get("usage") or {}
    return times[0], usage["prompt_tokens"]


def test_text_prompt_pays_tokenisation_and_ids_prompt_does_not(start) -> None:
    srv = start(FLAGS, env={"ENGINESIM_TIME_SCALE": str(SCALE)})
    per_token = catalog.load_engine_costs("sglang")["intake_per_token"]
    text = " ".join(f"w{i}" for i in range(2000))
    httpx.post(
        srv.url + "/generate", json={"input_ids": [300] * 16, "sampling_params": {"max_new_tokens": 1}}
    )
    gaps, n = [], 0
    for rep in range(3):
        t_text, n = _ttft(
            srv.url, "/generate", {"text": f"r{rep} {text}", "sampling_params": {"max_new_tokens": 1}}
        )
        ids = [400 + (7 * i + rep) % 5000 for i in range(n)]
        t_ids, n_ids = _ttft(
            srv.url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
        )
        assert n_ids == n
        gaps.append(t_text - t_ids)
    want = per_token * n * SCALE
    got = statistics.median(gaps)
    assert n > 1000
    assert abs(got - want) <= 0.25 * want, (got, want, gaps)
    # OpenAI completions: a string prompt is text, a list of ints is ids
    oai = {"model": "Qwen/Qwen3-0.6B", "max_tokens": 1, "stream_options": {"include_usage": True}}
    t_text, n = _ttft(srv.url, "/v1/completions", {**oai, "prompt": f"o {text}"})
    t_ids, n_ids = _ttft(srv.url, "/v1/completions", {**oai, "prompt": [500 + i % 4000 for i in range(n)]})
    want = per_token * n * SCALE
    assert n_ids == n and abs((t_text - t_ids) - want) <= 0.25 * want, (t_text, t_ids, n)
