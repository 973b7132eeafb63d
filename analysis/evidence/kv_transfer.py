"""KV transfers of a prefill/decode pair, read from both engines' /metrics and their logs.

Why both sources and both spellings: the engines count different things. SGLang's scheduler exports
failure counters and the *last* transfer's size and latency as gauges (no success counter:
`sglang:num_transfer_failed_reqs_total`, `sglang:kv_transfer_latency_ms`, `sglang:kv_transfer_total_mb`,
engine-surfaces reference), so a per-transfer time from SGLang is the last transfer's; vLLM's NIXL
connector exports histograms (`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`; names of
vLLM's NixlKVConnectorStats, not in the fixtures) whose count is the number of transfers; enginesim
exports counters for both flavours (`enginesim:kv_transfers_total`, bytes, seconds). Every figure says
which name it came from; a figure no name gives stays None (never 0). Failures are also counted from the
connector's own log lines (SGLang: "Prefill bootstrap failed for request", "Decode transfer failed for
request"), which survive a side that died before its last scrape.
"""

from __future__ import annotations

import re
from typing import Any

from analysis.evidence.prom import Scrape, delta

# (figure, candidate sample names, how): "delta" = counter after - before, "last" = gauge after
NAMES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("transfers", ("enginesim:kv_transfers_total", "vllm:nixl_xfer_time_seconds_count"), "delta"),
    (
        "failures",
        (
            "enginesim:kv_transfer_failures_total",
            "sglang:num_transfer_failed_reqs_total",
            "vllm:nixl_num_failed_transfers_total",
        ),
        "delta",
    ),
    (
        "bootstrap_failures",
        ("enginesim:kv_bootstrap_failures_total", "sglang:num_bootstrap_failed_reqs_total"),
        "delta",
    ),
    ("bytes", ("enginesim:kv_transfer_bytes_total", "vllm:nixl_bytes_transferred_sum"), "delta"),
    ("seconds", ("enginesim:kv_transfer_seconds_total", "vllm:nixl_xfer_time_seconds_sum"), "delta"),
    ("last_latency_ms", ("sglang:kv_transfer_latency_ms",), "last"),
    ("last_mb", ("sglang:kv_transfer_total_mb",), "last"),
    ("last_speed_gb_s", ("sglang:kv_transfer_speed_gb_s",), "last"),
)
# Queue depths (gauges) of either side: SGLang's PD queues, enginesim's, and each engine's waiting queue.
QUEUES = (
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "enginesim:pd_prefill_inflight_reqs",
    "enginesim:pd_decode_bootstrap_reqs",
    "enginesim:pd_decode_transfer_reqs",
    "sglang:num_queue_reqs",
    "vllm:num_requests_waiting",
)
_LOG_FAILURES = re.compile(
    r"(Prefill bootstrap failed for request|Decode transfer failed for request|KVTransferError)"
)


def _first(s: Scrape | None, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if s is not None and s.has(n)), None)


def side(before: Scrape | None, after: Scrape | None) -> dict[str, Any]:
    """One side's transfer figures over a run (counters as after - before, gauges as after)."""
    out: dict[str, Any] = {"sources": {}}
    for figure, names, how in NAMES:
        name = _first(after, names)
        if name is None:
            out[figure] = None
            continue
        out["sources"][figure] = name
        out[figure] = delta(before, after, name) if how == "delta" else after.total(name)  # type: ignore[union-attr]
    out["queues"] = {q: after.total(q) for q in QUEUES if after is not None and after.has(q)}
    return out


def log_failures(text: str) -> int:
    """Transfer or bootstrap failures the connector logged (one line each)."""
    return sum(1 for line in text.splitlines() if _LOG_FAILURES.search(line))


def summarise(prefill: dict[str, Any], decode: dict[str, Any], requests: int | None) -> dict[str, Any]:
    """The pair's figures: transfers counted on the decode side (it receives them; the prefill side's
    count when the decode side has none), failures from both, bytes and time per transfer."""
    transfers = decode.get("transfers")
    if transfers is None:
        transfers = prefill.get("transfers")
    fails = [x for x in (prefill.get("failures"), decode.get("failures")) if x is not None]
    boots = [
        x for x in (prefill.get("bootstrap_failures"), decode.get("bootstrap_failures")) if x is not None
    ]
    nbytes = decode.get("bytes") if decode.get("bytes") is not None else prefill.get("bytes")
    secs = decode.get("seconds") if decode.get("seconds") is not None else prefill.get("seconds")
    per = transfers if transfers else None
    return {
        "requests": requests,
        "transfers": transfers,
        "failures": sum(fails) if fails else None,
        "bootstrap_failures": sum(boots) if boots else None,
        "bytes": nbytes,
        "mb_per_transfer": round(nbytes / per / 1e6, 3) if per and nbytes is not None else None,
        "ms_per_transfer": round(secs / per * 1e3, 3) if per and secs is not None else None,
        "last_latency_ms": decode.get("last_latency_ms") or prefill.get("last_latency_ms"),
        "last_mb": decode.get("last_mb") or prefill.get("last_mb"),
        "prefill": prefill,
        "decode": decode,
    }
