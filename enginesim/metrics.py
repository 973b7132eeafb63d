"""Prometheus text exposition (stdlib) and the metric catalogues: each engine's (`sglang:*`, `vllm:*`)
and the emulator's own pacing evidence (`enginesim:*`).

Why: quickmap scrapes /metrics before and after each case; names, types and labels must match the
real engines (sglang:* only with --enable-metrics; vllm:* always) so the same parser works on both.
Each flavour (flavours/*.py) names its catalogue here; the buckets are the engines' own.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any

SGL_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGL_ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
]
SGL_E2E_BUCKETS = [
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
]
SGL_QUEUE_BUCKETS = [
    0.0,
    0.1,
    0.2,
    0.5,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
]
VLLM_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
VLLM_ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
VLLM_E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
VLLM_ITER_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


class Histogram:
    __slots__ = ("buckets", "counts", "n", "sum")

    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float, times: int = 1, total: float | None = None) -> None:
        self.counts[bisect_left(self.buckets, v)] += times
        self.n += times
        self.sum += v * times if total is None else total

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        acc = 0
        sep = "," if labels else ""
        for b, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{float(b)}"}} {float(acc)}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(self.n)}')
        out.append(f"{name}_sum{_braces(labels)} {self.sum}")
        out.append(f"{name}_count{_braces(labels)} {float(self.n)}")
        return out


def _braces(labels: str) -> str:
    return f"{{{labels}}}" if labels else ""


class Exposition:
    """Accumulates HELP/TYPE blocks into Prometheus text format 0.0.4."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        base = name[:-6] if kind == "counter" and name.endswith("_total") else name
        self.lines.append(f"# HELP {base} {help_}")
        self.lines.append(f"# TYPE {base} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_braces(labels)} {float(value)}")

    def hist(self, name: str, help_: str, labels: str, h: Histogram) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} histogram")
        self.lines.extend(h.lines(name, labels))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# ---- SGLang 0.5.6 ----------------------------------------------------------------------------------
def sglang_exposition(app: Any) -> str:
    e, st = app.e, app.e.stats
    lab = f'engine_type="unified",model_name="{app.served}",pp_rank="0",tp_rank="0"'
    tl = f'model_name="{app.served}"'
    x = Exposition()
    g = "gauge"
    x.metric("sglang:num_running_reqs", g, "The number of running requests.", [(lab, len(e.running))])
    x.metric("sglang:num_used_tokens", g, "The number of used tokens.", [(lab, e.used_tokens())])
    x.metric("sglang:token_usage", g, "The token usage.", [(lab, e.token_usage())])
    x.metric(
        "sglang:gen_throughput",
        g,
        "The generation throughput (token/s).",
        [(lab, st.last_gen_throughput)],
    )
    x.metric(
        "sglang:num_queue_reqs",
        g,
        "The number of requests in the waiting queue.",
        [(lab, len(e.waiting))],
    )
    x.metric("sglang:cache_hit_rate", g, "The prefix cache hit rate.", [(lab, st.cache_hit_rate)])
    x.metric(
        "sglang:max_total_num_tokens",
        g,
        "Maximum total number of tokens in the KV cache pool.",
        [(lab, e.capacity)],
    )
    x.metric(
        "sglang:is_cuda_graph",
        g,
        "Whether the batch is using CUDA graph.",
        [(lab, 1.0 if e.cost.cuda_graph else 0.0)],
    )
    if e.spec:
        acc_len = st.spec_emitted / st.spec_verify if st.spec_verify else 0.0
        rate = st.spec_accepted / max(st.spec_verify * e.n_drafts, 1)
        x.metric(
            "sglang:spec_accept_length",
            g,
            "The average acceptance length of speculative decoding.",
            [(lab, acc_len)],
        )
        x.metric(
            "sglang:spec_accept_rate",
            g,
            "The average acceptance rate of speculative decoding.",
            [(lab, rate)],
        )
    x.metric(
        "sglang:num_retracted_reqs",
        g,
        "The number of retracted requests.",
        [(lab, st.retracted_since_log)],
    )
    c = "counter"
    x.metric(
        "sglang:num_retracted_requests_total",
        c,
        "Total number of retracted requests.",
        [(lab, st.retracted_reqs)],
    )
    x.metric(
        "sglang:num_retracted_input_tokens_total",
        c,
        "Total number of retracted input tokens.",
        [(lab, st.retracted_in)],
    )
    x.metric(
        "sglang:num_retracted_output_tokens_total",
        c,
        "Total number of retracted output tokens.",
        [(lab, st.retracted_out)],
    )
    x.metric(
        "sglang:cuda_graph_passes_total",
        c,
        "Total number of forward passes by CUDA graph mode.",
        [(f'{lab},mode="{k}"', v) for k, v in sorted(st.graph_passes.items())]
        or [(f'{lab},mode="decode_none"', 0)],
    )
    x.metric(
        "sglang:realtime_tokens_total",
        c,
        "Total number of tokens processed, by mode.",
        [(f'{lab},mode="{k}"', v) for k, v in sorted(st.realtime_tokens.items())]
        or [(f'{lab},mode="decode"', 0)],
    )
    x.hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", lab, st.queue)
    x.metric("sglang:prompt_tokens_total", c, "Number of prefill tokens processed.", [(tl, st.prompt_tokens)])
    x.metric(
        "sglang:generation_tokens_total",
        c,
        "Number of generation tokens processed.",
        [(tl, st.generation_tokens)],
    )
    x.metric("sglang:cached_tokens_total", c, "Number of cached prompt tokens.", [(tl, st.cached_tokens)])
    x.metric("sglang:num_requests_total", c, "Number of requests processed.", [(tl, st.requests)])
    x.metric("sglang:num_aborted_requests_total", c, "Number of requests aborted.", [(tl, st.aborted)])
    x.hist("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tl, st.ttft)
    x.hist("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tl, st.itl)
    x.hist(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        tl,
        st.e2e,
    )
    x.hist("sglang:num_retractions", "Histogram of retractions per request.", tl, st.retractions_hist)
    return x.text()


# ---- vLLM 0.11.2 -----------------------------------------------------------------------------------
def vllm_exposition(app: Any) -> str:
    e, st = app.e, app.e.stats
    lab = f'engine="0",model_name="{app.served}"'
    x = Exposition()
    g, c = "gauge", "counter"
    x.metric(
        "vllm:num_requests_running",
        g,
        "Number of requests in model execution batches.",
        [(lab, len(e.running))],
    )
    x.metric(
        "vllm:num_requests_waiting",
        g,
        "Number of requests waiting to be processed.",
        [(lab, len(e.waiting))],
    )
    x.metric(
        "vllm:kv_cache_usage_perc",
        g,
        "KV-cache usage. 1 means 100 percent usage.",
        [(lab, e.token_usage())],
    )
    x.metric(
        "vllm:prefix_cache_queries_total",
        c,
        "Prefix cache queries, in terms of number of queried tokens.",
        [(lab, st.prefix_queries)],
    )
    x.metric(
        "vllm:prefix_cache_hits_total",
        c,
        "Prefix cache hits, in terms of number of cached tokens.",
        [(lab, st.prefix_hits)],
    )
    x.metric(
        "vllm:num_preemptions_total",
        c,
        "Cumulative number of preemption from the engine.",
        [(lab, st.preemptions)],
    )
    x.metric("vllm:prompt_tokens_total", c, "Number of prefill tokens processed.", [(lab, st.prompt_tokens)])
    x.metric(
        "vllm:generation_tokens_total",
        c,
        "Number of generation tokens processed.",
        [(lab, st.generation_tokens)],
    )
    reasons = ["stop", "length", "abort"]
    x.metric(
        "vllm:request_success_total",
        c,
        "Count of successfully processed requests.",
        [(f'{lab},finished_reason="{k}"', st.finished_by_reason.get(k, 0)) for k in reasons],
    )
    x.hist(
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        lab,
        st.iter_tokens,
    )
    x.hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, st.ttft)
    x.hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, st.itl)
    x.hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, st.e2e)
    x.hist(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        lab,
        st.queue,
    )
    x.metric(
        "vllm:cache_config_info",
        g,
        "Information of the LLMEngine CacheConfig",
        [
            (
                f'{lab},block_size="{app.cfg.page_size}",cache_dtype="{app.cfg.kv_cache_dtype}",'
                f'enable_prefix_caching="{app.cfg.prefix_cache}",gpu_memory_utilization="{app.cfg.mem_fraction}",'
                f'num_gpu_blocks="{e.cap.blocks}"',
                1.0,
            )
        ],
    )
    if e.spec:
        x.metric(
            "vllm:spec_decode_num_drafts_total",
            c,
            "Number of spec decoding drafts.",
            [(lab, st.spec_drafts)],
        )
        x.metric(
            "vllm:spec_decode_num_draft_tokens_total",
            c,
            "Number of draft tokens.",
            [(lab, st.spec_draft_tokens)],
        )
        x.metric(
            "vllm:spec_decode_num_accepted_tokens_total",
            c,
            "Number of accepted tokens.",
            [(lab, st.spec_accepted)],
        )
        x.metric(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            c,
            "Accepted tokens per draft position.",
            [(f'{lab},position="{i}"', st.spec_per_pos.get(i, 0)) for i in range(e.n_drafts)],
        )
    return x.text()


# ---- the emulator's own evidence (enginesim/README.md, Pacing) --------------------------------------
def sim_exposition(app: Any) -> str:
    """The emulator's own pacing evidence, under `enginesim:` (no real engine has these names)."""
    ev = app.e.evidence
    x = Exposition()
    for name, kind, help_, value in (
        ("time_scale", "gauge", "Wall seconds per emulated second now.", ev.scale),
        (
            "time_scale_auto",
            "gauge",
            "1 when /enginesim/pace sets each case's scale.",
            app.cfg.sim.auto_scale,
        ),
        ("time_scale_changes_total", "counter", "Time scale changes.", ev.scale_changes),
        ("emulated_seconds_total", "counter", "Emulated seconds of the written steps.", ev.emulated_s),
        ("wall_seconds_total", "counter", "Wall seconds busy (first arrival to last write).", ev.wall_s),
        ("slip_seconds_total", "counter", "Wall seconds the schedule moved (loop behind).", ev.slip_s),
        ("slips_total", "counter", "Schedule moves (more than one step behind).", ev.slips),
        ("steps_total", "counter", "Steps written.", ev.steps),
        ("events_total", "counter", "Request events written (one per request per step).", ev.events),
        ("write_seconds_total", "counter", "Wall seconds spent writing steps.", ev.write_s),
        ("cpu_seconds_total", "counter", "CPU seconds of this process.", _process_cpu_s()),
        ("sched_slice_seconds", "gauge", "Kernel time slice requested (0: the default).", ev.slice_s),
        ("first_tokens_total", "counter", "Requests that got their first token.", ev.first_tokens),
        (
            "ttft_wall_seconds_total",
            "counter",
            "Sum of TTFTs seen here (arrival to write).",
            ev.ttft_wall_s,
        ),
        (
            "ttft_late_seconds_total",
            "counter",
            "The emulator's lateness inside those TTFTs.",
            ev.ttft_late_s,
        ),
    ):
        x.metric(f"enginesim:{name}", kind, help_, [("", float(value))])
    x.hist("enginesim:step_lag_steps", "A step's write behind its deadline, in steps.", "", ev.lag_steps)
    x.hist("enginesim:step_lag_seconds", "A step's write behind its deadline.", "", ev.lag_seconds)
    x.hist(
        "enginesim:first_token_step_lag_steps",
        "Steps that produced first tokens: write behind the deadline, in steps.",
        "",
        ev.first_token_lag_steps,
    )
    return x.text()
