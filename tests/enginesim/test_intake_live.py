"""The live engine's intake latency, measured from the socket: only a prompt sent as text pays the
engine's tokenisation (per prompt token); token ids (as loadgen sends them) pay the fixed part alone."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from es_helpers import stream_events

from enginesim import catalog

SCALE = 10.0
FLAGS = ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--cuda-graph-max-bs", "64", "--disable-radix-cache"]
WORDS = " ".join(f"w{i}" for i in range(3000))
OAI = {"model": "Qwen/Qwen3-0.6B", "max_tokens": 1, "stream_options": {"include_usage": True}}
SGL = {"sampling_params": {"max_new_tokens": 1}}


def _ttft(url: str, path: str, payload: dict) -> tuple[float, int]:
    """Seconds to the first event and the prompt length the server counted."""
    times, events = stream_events(url, path, {**payload, "stream": True})
    usage = events[-1].get("meta_info") or events[-1].get("usage") or {}
    return times[0], usage["prompt_tokens"]


def _median_gap(url: str, path: str, text: Callable[[str], dict], ids: Callable[[list[int]], dict]) -> tuple:
    """Median over 3 pairs of (text TTFT - ids TTFT) for prompts of the same length, and that length."""
    gaps, n = [], 0
    for rep in range(3):
        t_text, n = _ttft(url, path, text(f"r{rep} {WORDS}"))
        t_ids, n_ids = _ttft(url, path, ids([400 + (7 * i + rep) % 5000 for i in range(n)]))
        assert n_ids == n
        gaps.append(t_text - t_ids)
    return statistics.median(gaps), n, gaps


def test_text_prompt_pays_tokenisation_and_ids_prompt_does_not(start) -> None:
    srv = start(FLAGS, env={"ENGINESIM_TIME_SCALE": str(SCALE)})
    per_token = catalog.load_engine_costs("sglang")["intake_per_token"]
    _ttft(srv.url, "/generate", {"input_ids": [300] * 16, **SGL})  # warm-up
    cases = {
        "/generate": (lambda s: {"text": s, **SGL}, lambda ids: {"input_ids": ids, **SGL}),
        "/v1/completions": (lambda s: {"prompt": s, **OAI}, lambda ids: {"prompt": ids, **OAI}),
    }
    for path, (text, ids) in cases.items():
        got, n, gaps = _median_gap(srv.url, path, text, ids)
        want = per_token * n * SCALE
        assert n > 3000
        assert abs(got - want) <= 0.25 * want, (path, got, want, gaps)
