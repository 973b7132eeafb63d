"""Which client wrote a result object, and the few counts the resume checks need (no numpy).

Detection is by keys, not by file name, because the roles may rename files and people bring
results from elsewhere:
- ``schema == "quickmap.loadgen/1"``: quickmap's loadgen;
- SGLang ``bench_serving``: ``total_output_tokens_retokenized``/``server_info``/``tag``
  or ``*_e2e_latency_ms``;
- vLLM ``bench serve``: ``total_token_throughput``/``endpoint_type``/``model_id``/``*_e2el_ms``/
  ``request_goodput`` (or the old typo ``"request_goodput:"``)/``latencies``.
"""

from __future__ import annotations

import math
from typing import Any

LOADGEN_SCHEMA = "quickmap.loadgen/1"
_SGLANG_KEYS = (
    "total_output_tokens_retokenized",
    "server_info",
    "tag",
    "mean_e2e_latency_ms",
    "accept_length",
)
_VLLM_KEYS = (
    "total_token_throughput",
    "endpoint_type",
    "model_id",
    "mean_e2el_ms",
    "request_goodput",
    "request_goodput:",
    "latencies",
    "tokenizer_id",
)


def detect_format(obj: dict[str, Any]) -> str | None:
    """Return "loadgen", "sglang", "vllm" or None (not a result we understand)."""
    schema = obj.get("schema")
    if isinstance(schema, str) and schema.startswith("quickmap.loadgen/"):
        return "loadgen"
    if "completed" not in obj:
        return None
    if any(k in obj for k in _VLLM_KEYS):
        return "vllm"
    if any(k in obj for k in _SGLANG_KEYS):
        return "sglang"
    if "mean_ttft_ms" in obj or "ttfts" in obj:
        return "sglang"  # the shared SGLang-style key set without either client's markers
    return None


def as_int(value: Any) -> int | None:
    """Integer value of a JSON number (or numeric string); None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def counts(obj: dict[str, Any]) -> dict[str, Any]:
    """completed / failed / per-request output lengths, from whichever keys the client wrote."""
    fmt = detect_format(obj)
    completed = as_int(obj.get("completed"))
    failed = as_int(obj.get("failed"))
    output_lens: list[int] | None = None
    reqs = obj.get("requests")
    if fmt == "loadgen" and isinstance(reqs, list):
        ok = [r for r in reqs if isinstance(r, dict) and r.get("success")]
        if completed is None:
            completed = len(ok)
        if failed is None:
            failed = len(reqs) - len(ok)
        output_lens = [as_int(r.get("output_tokens")) or 0 for r in ok]
    elif isinstance(obj.get("output_lens"), list):
        lens = obj["output_lens"]
        errors = obj.get("errors")
        if isinstance(errors, list) and len(errors) == len(lens):
            output_lens = [as_int(n) or 0 for n, e in zip(lens, errors, strict=True) if not e]
            if failed is None:
                failed = sum(1 for e in errors if e)
        else:
            output_lens = [as_int(n) or 0 for n in lens]
    return {
        "format": fmt,
        "completed": completed,
        "failed": failed,
        "output_lens": output_lens,
        "total_output_tokens": as_int(obj.get("total_output_tokens")),
        "complete": obj.get("complete") if fmt == "loadgen" else None,
        "reliable": obj.get("reliable") if fmt == "loadgen" else None,
    }
