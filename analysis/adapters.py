"""guidellm and AIPerf results mapped onto the flat keys the readers take (SGLang/vLLM's names).

Each client's figures land in a column only where its definition matches the column's
(``analysis/clients.py`` states both, and the report prints them):

- guidellm ``benchmarks.json``: the last benchmark. Per-request records (``requests.successful``)
  give TTFT (``time_to_first_token_ms``), E2E (``request_latency``, request start to response end)
  and TPOT (``inter_token_latency_ms`` = (last token - first token)/(output tokens - 1), our TPOT).
  guidellm's own ``time_per_output_token_ms`` includes the first token's wait, so it is no TPOT and
  is not used. Its summary percentiles are nearest-rank (no interpolation): statistics are
  recomputed from the records with numpy's linear percentiles whenever the records are complete,
  and taken from guidellm's summary (source ``tool``) only when it kept a sample or none.
- AIPerf ``profile_export_aiperf.json``: one stats object per metric. ``time_to_first_token`` is
  TTFT, ``request_latency`` E2E, its ``inter_token_latency`` is (E2E - TTFT)/(OSL - 1) per request,
  i.e. our TPOT, and ``inter_chunk_latency`` is one sample per streamed chunk (our ``itl_event``).
  AIPerf's std is the sample std (ours: population), so it is left out and recomputed when the
  per-request records are at hand.
- AIPerf ``profile_export.jsonl``: one record per request (``metadata``, ``metrics`` with a value and a
  unit each, ``error``); only the profiling phase counts. Duration = last response - first request,
  AIPerf's own definition.
"""

from __future__ import annotations

from typing import Any

from module_utils.bench_file import aiperf_profiling, aiperf_value

_STAT_NAMES = (("mean", "avg"), ("median", "p50"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
               ("p99", "p99"))  # fmt: skip
_MS_PER_UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}
# guidellm summary distribution -> our metric name, scale to ms (request_latency is in seconds)
_GUIDELLM_SUMMARY = (
    ("ttft", "time_to_first_token_ms", 1.0),
    ("tpot", "inter_token_latency_ms", 1.0),
    ("e2e_latency", "request_latency", 1000.0),
)
# AIPerf metric -> our metric name in {stat}_{name}_ms (readers' tool names for "aiperf")
_AIPERF_LATENCIES = (
    ("time_to_first_token", "ttft"),
    ("inter_token_latency", "tpot"),
    ("request_latency", "e2e_latency"),
    ("inter_chunk_latency", "itl_event"),
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _dig(obj: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and -len(obj) <= key < len(obj):
            obj = obj[key]
        else:
            return None
    return obj


def _per_request(recs: list[dict[str, Any]], fields: dict[str, tuple[str, float]]) -> dict[str, list[Any]]:
    """Flat per-request lists: ``{out_key: (record field, scale)}``, None where a record lacks it."""
    out: dict[str, list[Any]] = {}
    for key, (field, scale) in fields.items():
        col = []
        for r in recs:
            v = _num(r.get(field))
            col.append(v * scale if v is not None else None)
        out[key] = col
    return out


def guidellm(obj: dict[str, Any]) -> dict[str, Any]:
    """The last benchmark of a guidellm report as flat keys."""
    bench = obj["benchmarks"][-1]
    metrics = bench.get("metrics") or {}
    totals = metrics.get("request_totals") or {}
    recs = [r for r in _dig(bench, "requests", "successful") or [] if isinstance(r, dict)]
    completed = _num(totals.get("successful"))
    failed = None
    if _num(totals.get("errored")) is not None and _num(totals.get("incomplete")) is not None:
        failed = _num(totals["errored"]) + _num(totals["incomplete"])
    strategy = _dig(bench, "config", "strategy") or {}
    data_cfg = _dig(obj, "config", "spec", "data", 0) or {}
    flat: dict[str, Any] = {
        "duration": _num(bench.get("duration")),
        "completed": completed,
        "failed": failed,
        "num_prompts": _num(totals.get("total")),
        "total_input_tokens": _num(_dig(metrics, "prompt_token_count", "successful", "total_sum")),
        "total_output_tokens": _num(_dig(metrics, "output_token_count", "successful", "total_sum")),
        "max_concurrency": _num(strategy.get("max_concurrency") or strategy.get("streams")),
        "request_rate": _num(strategy.get("rate")),
        "random_input_len": _num(data_cfg.get("prompt_tokens")),
        "random_output_len": _num(data_cfg.get("output_tokens")),
        "_client": f"guidellm {_dig(obj, 'metadata', 'guidellm_version') or ''}".strip(),
        "_request_meta": {"start_epoch_s": [_num(r.get("request_start_time")) for r in recs]},
    }
    complete_records = completed is not None and recs and len(recs) == completed
    if complete_records:
        cols = _per_request(recs, {
            "ttfts": ("time_to_first_token_ms", 1e-3), "latencies": ("request_latency", 1.0),
            "_tpot_ms": ("inter_token_latency_ms", 1.0), "output_lens": ("output_tokens", 1.0),
            "input_lens": ("prompt_tokens", 1.0),
        })  # fmt: skip
        flat.update(cols, errors=[""] * len(recs))
    else:  # a sample of the records (or none): guidellm's own statistics, nearest-rank percentiles
        for name, metric, scale in _GUIDELLM_SUMMARY:
            dist = _dig(metrics, metric, "successful") or {}
            for ours, theirs in (("mean", "mean"), ("median", "median"), ("std", "std_dev")):
                if (v := _num(dist.get(theirs))) is not None:
                    flat[f"{ours}_{name}_ms"] = v * scale
            for q in ("p90", "p95", "p99"):
                if (v := _num(_dig(dist, "percentiles", q))) is not None:
                    flat[f"{q}_{name}_ms"] = v * scale
    return flat


def _aiperf_ms(block: Any) -> dict[str, float]:
    """An AIPerf stats object's values in ms (its ``unit`` says what they were)."""
    if not isinstance(block, dict):
        return {}
    scale = _MS_PER_UNIT.get(str(block.get("unit")))
    if scale is None:
        return {}
    out = {}
    for key, raw in block.items():
        value = _num(raw)
        if value is not None:
            out[key] = value * scale
    return out


def aiperf(obj: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's summary as flat keys (no std: AIPerf's is the sample std, ours the population std)."""

    def avg(name: str) -> float | None:
        return _num(_dig(obj, name, "avg"))

    completed = avg("completed_request_count")
    if completed is None:
        completed = avg("request_count")
    failed = avg("error_request_count")
    errors = obj.get("error_summary")
    if failed is None and isinstance(errors, list):
        failed = float(sum(_num(e.get("count")) or 0 for e in errors if isinstance(e, dict)))
    profiling = next(
        (p for p in _dig(obj, "input_config", "phases") or [] if isinstance(p, dict)
         and p.get("kind", "profiling") == "profiling"), {},
    )  # fmt: skip
    prompts = _dig(obj, "input_config", "datasets", 0, "prompts") or {}
    flat: dict[str, Any] = {
        "duration": _num(_dig(obj, "benchmark_duration", "avg")),
        "completed": completed,
        "failed": failed,
        "num_prompts": _num(profiling.get("requests")) or avg("request_count"),
        "total_input_tokens": avg("total_isl"),
        "total_output_tokens": avg("total_osl")
        if avg("total_osl") is not None
        else avg("total_output_tokens"),
        "request_throughput": avg("request_throughput"),
        "input_throughput": avg("input_token_throughput"),
        "output_throughput": avg("output_token_throughput"),
        "total_throughput": avg("total_token_throughput"),
        "max_concurrency": _num(profiling.get("concurrency")),
        "random_input_len": _num(_dig(prompts, "isl", "mean")),
        "random_output_len": _num(_dig(prompts, "osl", "mean")),
        "_client": f"aiperf {obj.get('aiperf_version') or ''}".strip(),
    }
    for theirs, ours in _AIPERF_LATENCIES:
        values = _aiperf_ms(obj.get(theirs))
        for stat, key in _STAT_NAMES:
            if key in values:
                flat[f"{stat}_{ours}_ms"] = values[key]
    return flat


def aiperf_records(obj: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's per-request JSONL (profiling phase) as flat keys with per-request arrays."""
    recs = aiperf_profiling(obj)
    ok = [not r.get("error") for r in recs]
    starts = [_num(_dig(r, "metadata", "request_start_ns")) for r in recs]
    ends = [_num(_dig(r, "metadata", "request_end_ns")) for r in recs]
    known_s, known_e = [t for t in starts if t is not None], [t for t in ends if t is not None]
    duration = (max(known_e) - min(known_s)) / 1e9 if known_s and known_e else None

    def col(name: str, scale: float = 1.0) -> list[Any]:
        out = []
        for r in recs:
            v = _num(aiperf_value(r, name))
            out.append(v * scale if v is not None else None)
        return out

    out_lens = [v or 0.0 for v in col("output_sequence_length")]
    in_lens = col("input_sequence_length")
    chunks = [aiperf_value(r, "inter_chunk_latency") for r in recs]
    flat: dict[str, Any] = {
        "duration": duration,
        "completed": float(sum(ok)),
        "failed": float(len(recs) - sum(ok)),
        "num_prompts": float(len(recs)),
        "total_output_tokens": float(sum(n for n, good in zip(out_lens, ok, strict=True) if good)),
        "total_input_tokens": float(sum(n or 0 for n, good in zip(in_lens, ok, strict=True) if good)),
        "ttfts": col("time_to_first_token", 1e-3),
        "latencies": col("request_latency", 1e-3),
        "_tpot_ms": col("inter_token_latency"),
        "output_lens": out_lens,
        "input_lens": in_lens,
        "itls": [
            [v / 1000.0 if _num(v) is not None else v for v in c] if isinstance(c, list) else []
            for c in chunks
        ],
        "errors": [_error_text(r) if not good else "" for r, good in zip(recs, ok, strict=True)],
        "_client": "aiperf (per-request records)",
        "_request_meta": {"start_epoch_s": [t / 1e9 if t is not None else None for t in starts]},
    }
    return flat


def _error_text(rec: dict[str, Any]) -> str:
    err = rec.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or "error")
    return str(err or "error")


def attach_records(flat: dict[str, Any], records: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's summary plus its per-request JSONL (the same run): the records' arrays, the summary's
    figures (what the summary lacks, e.g. std, is recomputed from the records)."""
    per_request = aiperf_records(records)
    for key in (
        "ttfts",
        "latencies",
        "_tpot_ms",
        "output_lens",
        "input_lens",
        "itls",
        "errors",
        "_request_meta",
    ):
        flat[key] = per_request[key]
    flat["_client"] = flat["_client"] + " + per-request records"
    return flat
