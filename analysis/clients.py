"""What each client's figure in each summary column is, and whether it is comparable across clients.

The same word means different things in different clients (guidellm's TPOT includes the wait for the
first token, AIPerf's "inter token latency" is a TPOT, vLLM's ITL is one sample per streamed chunk).
``readers``/``adapters`` put a client's figure in a column only where its definition is ours; this
table says so for every client a run holds, and ``report.md`` prints it, so no column silently mixes
two definitions. ``aggregate.csv`` also keeps one group per ``source_client``.

Marks: ``=`` same definition as ours; ``≈`` same quantity, measured at a slightly different point
(named in the text); ``—`` the client has no such figure (the column stays empty for it).
"""

from __future__ import annotations

# Our definitions (the column, as analysis/README.md "Metrics" states them).
COLUMNS: dict[str, str] = {
    "ttft": "first content-bearing event − request send",
    "tpot": "per request (E2E − TTFT)/(output tokens − 1); statistics over requests",
    "itl": "gap between content events split evenly over the event's tokens (one sample per token)",
    "itl_event": "gap between content events (one sample per streamed event)",
    "e2e": "last content event − request send",
    "throughput": "tokens (or requests) of successful requests / main-phase duration",
    "percentiles": "numpy linear interpolation over the samples; std = population std",
}

# format -> column -> (mark, what the client's figure is)
CLIENTS: dict[str, dict[str, tuple[str, str]]] = {
    "loadgen": {
        "ttft": ("=", "quickmap's own client: the definitions above"),
        "tpot": ("=", "per request, as above"),
        "itl": ("=", "`itl_per_token`"),
        "itl_event": ("=", "`itl` (per event)"),
        "e2e": ("=", "as above"),
        "throughput": ("=", "over the main phase (warm-up excluded)"),
        "percentiles": ("=", "linear; population std"),
    },
    "sglang": {
        "ttft": ("≈", "first non-empty chunk − start, taken before a fresh connection (connect included)"),
        "tpot": ("=", "per request (latency − TTFT)/(output − 1)"),
        "itl": ("=", "native backend: chunk gap split over its new tokens"),
        "itl_event": ("—", "not written"),
        "e2e": ("≈", "`e2e_latency`: until the last non-empty line, usage chunk and [DONE] included"),
        "throughput": ("≈", "duration includes its /server_info call after the run"),
        "percentiles": ("=", "linear; population std"),
    },
    "vllm": {
        "ttft": ("≈", "first SSE message with choices, even an empty or role-only one"),
        "tpot": ("=", "per request (E2E − TTFT)/(output − 1)"),
        "itl": ("—", "vLLM's ITL is per streamed chunk: in itl_event, never here"),
        "itl_event": ("=", "`itl`: gap between SSE messages with choices"),
        "e2e": ("=", "`e2el`: last chunk with choices − start"),
        "throughput": ("=", "completed requests' tokens / duration"),
        "percentiles": ("=", "linear; population std"),
    },
    "guidellm": {
        "ttft": ("≈", "`time_to_first_token_ms`: first iteration with a token − request start (wall clock)"),
        "tpot": ("=", "`inter_token_latency_ms` (last − first token)/(output − 1); its "
                      "`time_per_output_token_ms` includes TTFT and is not used"),
        "itl": ("—", "no per-gap samples"),
        "itl_event": ("—", "no per-gap samples"),
        "e2e": ("≈", "`request_latency`: request start → response end"),
        "throughput": ("=", "recomputed: successful requests' tokens / benchmark duration"),
        "percentiles": ("≈", "recomputed from its per-request records (linear); guidellm's own are "
                             "nearest-rank and used only when it kept no complete record set"),
    },
    "aiperf": {
        "ttft": ("≈", "`time_to_first_token`: first byte of the first response event"),
        "tpot": ("=", "AIPerf's `inter_token_latency` = (request_latency − TTFT)/(OSL − 1) per request"),
        "itl": ("—", "AIPerf has no per-token split"),
        "itl_event": ("=", "`inter_chunk_latency`: one sample per streamed chunk"),
        "e2e": ("=", "`request_latency`: last response − request start"),
        "throughput": ("=", "AIPerf's: duration = last response − first request"),
        "percentiles": ("≈", "linear; AIPerf's std is the sample std, so std is only recomputed from "
                             "its per-request records (population)"),
    },
}  # fmt: skip
CLIENTS["aiperf_records"] = CLIENTS["aiperf"]


def definitions_table(formats: list[str]) -> list[str]:
    """Markdown lines: one row per column, one cell per client format present in the run."""
    present = [f for f in CLIENTS if f in formats and not (f == "aiperf_records" and "aiperf" in formats)]
    if not present:
        return []
    header = ["column", "our definition", *present]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for col, ours in COLUMNS.items():
        cells = [f"{CLIENTS[f][col][0]} {CLIENTS[f][col][1]}" for f in present]
        lines.append("| " + " | ".join([f"`{col}`", ours, *cells]).replace("\n", " ") + " |")
    return lines
