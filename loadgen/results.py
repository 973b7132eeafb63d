"""Per-request records and the summary (schema "quickmap.loadgen/1", analysis/README.md).

Definitions (also in README.md and stated in the output's ``definitions``):
  TTFT   = first content-bearing event received - request handed to the socket (send)
  E2E    = last content-bearing event received - send
  TPOT   = (E2E - TTFT) / (output_tokens - 1), per request, for output_tokens > 1
  ITL per event = gap between consecutive content events (*_itl_ms)
  ITL per token = each gap split evenly over the tokens of the later event (*_itl_per_token_ms,
                  and ``itls`` in --output-details, like SGLang's native split)
  queue time    = due time -> concurrency slot, for a request that found every slot busy (else 0)
  schedule lag  = send - scheduled - queue time (the client's own lateness)
Percentiles: linear interpolation (numpy's default), std: population.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import operator
import os
import tempfile

from .records import RequestRecord

READ_TOGETHER_LIMIT = 0.005  # of all event gaps: about where a p99 starts to move
ITL_P99_AMBIGUITY_LIMIT_MS = 1.0  # the ITL p99 accuracy target: an ambiguity above it is not a figure

DEFINITIONS = {
    "ttft": "first content event received - request handed to the socket",
    "e2e_latency": "last content event received - request handed to the socket",
    "tpot": "(e2e - ttft) / (output_tokens - 1), per request",
    "itl": "gap between consecutive content events (one sample per event gap)",
    "itl_per_token": "each event gap split evenly over that event's tokens",
    "queue_time": "due time -> concurrency slot, when every slot was busy at the due time (else 0)",
    "schedule_lag": "send - scheduled - queue_time (client lateness)",
    "percentiles": "linear interpolation; std is the population std",
}


def pct(sorted_vals: list[float], q: float) -> float | None:
    """numpy.percentile(..., q) with linear interpolation, on an already sorted list."""
    n = len(sorted_vals)
    if n == 0:
        return None
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * frac


def summary(vals: list[float]) -> dict[str, float | None]:
    if not vals:
        return {k: None for k in ("mean", "median", "std", "p90", "p95", "p99", "max")}
    s = sorted(vals)
    mean = math.fsum(s) / len(s)
    dev = [x - mean for x in s]  # two passes (exact), but no generator: 500k ITLs take ~0.1 s less
    var = math.fsum(map(operator.mul, dev, dev)) / len(s)
    return {
        "mean": mean,
        "median": pct(s, 50),
        "std": math.sqrt(var),
        "p90": pct(s, 90),
        "p95": pct(s, 95),
        "p99": pct(s, 99),
        "max": s[-1],
    }


def request_record(rec: RequestRecord, t0_ns: int, details: bool) -> dict:
    """Turn a worker's ``RequestRecord`` into the result's per-request record.

    A request cut short by an interruption (class ``cancelled``) keeps the event times and tokens it
    had received (``event_times_s``/``event_tokens``, with or without --output-details): the part
    of its stream that was measured.
    """
    send, sched, slot = rec.send_ns, rec.sched_ns, rec.slot_ns
    evt = rec.ev_times
    # a request that found every slot busy waited from its due time to its slot (queue time);
    # one that found a free slot has no queue time, so all its lateness is schedule lag
    queue_ns = max(slot - sched, 0) if rec.enq_ns else 0
    lag_ns = max(send - sched - queue_ns, 0) if send else None
    ok = rec.error_class is None
    d = {
        "index": rec.index,
        "scheduled_s": (sched - t0_ns) / 1e9,
        "send_s": (send - t0_ns) / 1e9 if send else None,
        "queue_time_ms": queue_ns / 1e6,
        "schedule_lag_ms": lag_ns / 1e6 if lag_ns is not None else None,
        "ttft_ms": (evt[0] - send) / 1e6 if ok and evt else None,
        "e2e_ms": (evt[-1] - send) / 1e6 if ok and evt else None,
        "tpot_ms": None,
        "input_tokens": rec.input_tokens,
        "output_tokens": rec.output_tokens if ok else 0,
        "tokens_source": rec.tokens_source,
        "cached_tokens": rec.cached_tokens,
        "success": ok,
        "error_class": rec.error_class,
        "error": rec.error,
        "http_status": rec.http_status,
    }
    if rec.spec:
        d["spec"] = rec.spec
    if ok and evt and rec.output_tokens > 1:
        d["tpot_ms"] = (d["e2e_ms"] - d["ttft_ms"]) / (rec.output_tokens - 1)
    if details or (rec.error_class == "cancelled" and send):
        d["event_times_s"] = [(t - send) / 1e9 for t in evt]
        d["event_tokens"] = list(rec.event_tokens)
    d["_end_ns"] = rec.end_ns
    d["_send"] = send
    d["_evt"] = evt
    d["_evtok"] = rec.event_tokens
    return d


def itl_samples(evt: list[int], evtok: list[int]) -> tuple[list[float], list[float]]:
    """(per-event gaps, per-token split gaps) in seconds for one request."""
    per_ev = [(b - a) / 1e9 for a, b in itertools.pairwise(evt)]
    later = evtok[1:]  # a first event's extra tokens add no gap
    if later.count(1) == len(later):  # one token per later event (the usual stream): the same list
        return per_ev, per_ev
    per_tok: list[float] = []
    for g, n in zip(per_ev, evtok[1:], strict=True):
        if n > 0:
            per_tok.extend([g / n] * n)
    return per_ev, per_tok


def _runs_read_together(evt: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """(first, last) event index of each run of events that share one time, and the gaps (ns).

    The zero gaps are found with ``list.index`` (a C scan), so a long stream with one such run costs
    about as little as one with none: the self-check runs on every result, 500k events included."""
    gaps = list(map(operator.sub, evt[1:], evt[:-1]))
    runs = []
    k = 0
    while True:
        try:
            k = gaps.index(0, k)
        except ValueError:
            return runs, gaps
        first = k
        while k < len(gaps) and gaps[k] == 0:
            k += 1
        runs.append((first, k))


def _spread_runs(evt: list[int], floor_ns: int, runs: list[tuple[int, int]], gaps: list[int]) -> list[int]:
    zeros = sum(j - i for i, j in runs)
    positive = sorted(gaps)[zeros:]  # the stream's non-zero gaps (the zero ones sort first)
    spacing = positive[len(positive) // 2] if positive else None
    out = list(evt)
    for i, j in runs:
        prev = evt[i - 1] if i > 0 else floor_ns
        even = max(evt[j] - prev, 0) / (j - i + 1)
        step = even if spacing is None else min(spacing, even)
        for m in range(i, j):
            out[m] = round(evt[j] - (j - m) * step)
    return out


def spread_together(evt: list[int], floor_ns: int) -> list[int]:
    """One stream's event times with each run of events read together spread back out.

    Events that one read returned share the last one's time (the kernel's stamp of the last segment,
    and TCP merges segments that queue while nobody reads), so the gap before them reads long and
    the gaps between them read 0. Their true times are unknown; this gives each run the spacing the
    stream kept elsewhere (its median non-zero gap), ending at the shared time, and never earlier
    than an even split of the interval since the previous event (``floor_ns`` = the send time for a
    run that starts the stream). A run that the server really wrote at once after an ordinary gap
    is only split evenly, which moves nothing in the tail; a run read late regains its true gaps.
    ``build`` compares the ITL p99 of these times with the measured one: the difference is how far
    reads together can have moved the reported p99.
    """
    runs, gaps = _runs_read_together(evt)
    return _spread_runs(evt, floor_ns, runs, gaps) if runs else evt


def itl_p99_ambiguity_ms(
    recs: list[dict], per_event_gaps: list[list[float]], measured_p99_ms: float
) -> float:
    """How far events read together can have moved the ITL p99 (ms): the p99 of the per-event gaps
    with each run of events read together spread back out (``spread_together``) against the
    measured p99. ``per_event_gaps`` are each record's measured gaps (s); only the gaps around a
    run are replaced, so the cost follows the runs, not the events."""
    spread: list[float] = []
    for r, measured in zip(recs, per_event_gaps, strict=True):
        if 0.0 not in measured:
            spread.extend(measured)
            continue
        evt = r["_evt"]
        runs, gaps = _runs_read_together(evt)
        sp = _spread_runs(evt, r["_send"] or evt[0], runs, gaps)
        patched = list(measured)
        for i, j in runs:
            for k in range(max(i - 1, 0), j):
                patched[k] = (sp[k + 1] - sp[k]) / 1e9
        spread.extend(patched)
    spread.sort()
    return abs(measured_p99_ms - 1e3 * pct(spread, 99))


def max_concurrent(intervals: list[tuple[int, int]]) -> int:
    """Exact peak of overlapping half-open [send, end) intervals (sweep line)."""
    pts = []
    for a, b in intervals:
        pts.append((a, 1))
        pts.append((b, -1))
    pts.sort(key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in pts:
        cur += d
        best = max(best, cur)
    return best


def build(
    cfg: dict,
    main_recs: list[RequestRecord],
    t0_ns: int,
    main_start_ns: int,
    main_over_ns: int,
    lags_s: list[float],
    details: bool,
    complete: bool,
    lag_limit_ms: float,
    extra_reasons: list[str],
) -> dict:
    """The whole result document from the main phase's raw records."""
    recs = sorted((request_record(r, t0_ns, details) for r in main_recs), key=lambda d: d["index"])
    ok = [r for r in recs if r["success"]]
    ends = [r["_end_ns"] for r in recs if r["_end_ns"]]
    main_end_ns = max(ends) if ends else main_over_ns
    duration = max((main_end_ns - main_start_ns) / 1e9, 1e-9)
    ttfts = [r["ttft_ms"] for r in ok]
    e2es = [r["e2e_ms"] for r in ok]
    tpots = [r["tpot_ms"] for r in ok if r["tpot_ms"] is not None]
    pairs = [itl_samples(r["_evt"], r["_evtok"]) if r["success"] else ([], []) for r in recs]
    itl_ev = [gap for ev, _ in pairs for gap in ev]
    # itl_samples hands back the per-event list itself when no gap is split
    split = any(tok is not ev for ev, tok in pairs)
    itl_tok = [gap for _, tok in pairs for gap in tok] if split else itl_ev
    itls_details = [tok for _, tok in pairs]
    total_in = sum(r["input_tokens"] or 0 for r in ok)
    total_out = sum(r["output_tokens"] or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in recs:
        if not r["success"]:
            errors[r["error_class"]] = errors.get(r["error_class"], 0) + 1
    qt = [r["queue_time_ms"] for r in recs if r["send_s"] is not None]
    sl = [r["schedule_lag_ms"] for r in recs if r["schedule_lag_ms"] is not None]
    lag_ms = sorted(x * 1e3 for x in lags_s)
    sl_sorted = sorted(sl)

    def tri(v: list[float]) -> dict:
        return {
            "p50": pct(v, 50) if v else None,
            "p99": pct(v, 99) if v else None,
            "max": v[-1] if v else None,
        }

    reasons = list(extra_reasons)
    # Events of one stream that one read returned carry the time of the last of them (kernel stamp of
    # the last segment, or the read's time): the gap between them reads 0 and the gap before them
    # grows by as much. Past READ_TOGETHER_LIMIT of all gaps, ITL and TTFT percentiles are not claimed.
    read_together = itl_ev.count(0.0)
    if itl_ev and read_together > READ_TOGETHER_LIMIT * len(itl_ev):
        reasons.append(
            f"{read_together} of {len(itl_ev)} events ({100 * read_together / len(itl_ev):.1f}%) were read "
            f"together with the next event of their stream (> {100 * READ_TOGETHER_LIMIT:g}%): their times "
            "are the later event's, so ITL and TTFT percentiles are not trustworthy (the client or the box "
            "fell behind the stream, or the server sent them at once)"
        )
    # ITL lists hold one value per streamed token (500k for 512 x 1K): summarise each once
    itl_summary = summary([x * 1e3 for x in itl_ev])
    # Below that share, a few late reads can still move the p99 itself when their long gaps land in
    # the tail (a reader behind at the busiest moments): how far they can move it is measured, and
    # past the ITL p99 target the p99 is not claimed.
    ambiguity = 0.0
    if read_together:
        ambiguity = itl_p99_ambiguity_ms(recs, [ev for ev, _ in pairs], itl_summary["p99"])
    if ambiguity > ITL_P99_AMBIGUITY_LIMIT_MS:
        reasons.append(
            f"ITL p99 ambiguity {ambiguity:.2f} ms > {ITL_P99_AMBIGUITY_LIMIT_MS:g} ms: with the "
            f"{read_together} events read together with the next event of their stream spread back "
            f"out at their stream's usual gap, the ITL p99 moves from {itl_summary['p99']:.2f} ms by "
            f"{ambiguity:.2f} ms, so the reported ITL p99 is not trustworthy (the client or the box fell "
            "behind the stream at its busiest moments, or the server sent them at once)"
        )
    if lag_ms and pct(lag_ms, 99) > lag_limit_ms:
        reasons.append(f"event-loop lag p99 {pct(lag_ms, 99):.1f} ms > {lag_limit_ms:g} ms")
    if sl_sorted and pct(sl_sorted, 99) > lag_limit_ms:
        reasons.append(f"schedule lag p99 {pct(sl_sorted, 99):.1f} ms > {lag_limit_ms:g} ms")
    res = dict(cfg)
    res.update(
        {
            "complete": complete,
            "reliable": not reasons,
            "reliability": {
                "loop_lag_ms": tri(lag_ms),
                "schedule_lag_ms": tri(sl_sorted),
                "events_read_together": read_together,
                "event_gaps": len(itl_ev),
                "itl_p99_ambiguity_ms": ambiguity,
                "reasons": reasons,
            },
            "t0_epoch_s": cfg["t0_epoch_s"],
            "main_start_s": (main_start_ns - t0_ns) / 1e9,
            "main_end_s": (main_end_ns - t0_ns) / 1e9,
            "duration": duration,
            "completed": len(ok),
            "failed": len(recs) - len(ok),
            "total_input_tokens": total_in,
            "total_output_tokens": total_out,
            "request_throughput": len(ok) / duration,
            "input_throughput": total_in / duration,
            "output_throughput": total_out / duration,
            "total_throughput": (total_in + total_out) / duration,
        }
    )
    # the per-token split is summarised only when some event carried more than one token (else it
    # is the same list as the per-event one, summarised above)
    for name, s in (
        ("ttft", summary(ttfts)),
        ("tpot", summary(tpots)),
        ("itl", itl_summary),
        ("e2e_latency", summary(e2es)),
    ):
        for k in ("mean", "median", "std", "p90", "p95", "p99"):
            res[f"{k}_{name}_ms"] = s[k]
    res["max_itl_ms"] = itl_summary["max"]
    st = summary([x * 1e3 for x in itl_tok]) if split else itl_summary
    for k in ("mean", "median", "p99"):
        res[f"{k}_itl_per_token_ms"] = st[k]
    sq = summary(qt)
    res["mean_queue_time_ms"], res["p99_queue_time_ms"] = sq["mean"], sq["p99"]
    ss = summary(sl)
    res["mean_schedule_lag_ms"], res["p99_schedule_lag_ms"] = ss["mean"], ss["p99"]
    sends = sorted(r["send_s"] for r in recs if r["send_s"] is not None)
    res["achieved_request_rate"] = (
        (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 and sends[-1] > sends[0] else None
    )
    res["max_concurrent_requests"] = max_concurrent(
        [(int(r["send_s"] * 1e9), r["_end_ns"] - t0_ns) for r in recs if r["send_s"] is not None]
    )
    res["concurrency"] = math.fsum(e2es) / 1e3 / duration if e2es else 0.0
    res["errors_by_class"] = errors
    if details:
        res["input_lens"] = [r["input_tokens"] for r in recs]
        res["output_lens"] = [r["output_tokens"] for r in recs]
        res["ttfts"] = [(r["ttft_ms"] or 0.0) / 1e3 for r in recs]
        res["itls"] = itls_details
    for r in recs:
        del r["_end_ns"], r["_evt"], r["_evtok"], r["_send"]
    res["requests"] = recs
    res["definitions"] = DEFINITIONS
    return res


def write_atomic(path: str, doc: dict) -> None:
    """Temp file in the same directory + os.replace, so readers never see half a file."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".loadgen-", suffix=".tmp", dir=d)
    try:
        # json.dumps, not json.dump: only the one-shot path uses the C encoder (4x faster on a
        # 500k-timestamp result with --output-details).
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def banner(res: dict) -> str:
    """SGLang-style result banner for the log."""
    rows = [
        ("Backend:", res["backend"]),
        ("Traffic request rate:", "inf" if res["request_rate"] is None else res["request_rate"]),
        ("Max request concurrency:", res["max_concurrency"] or "not set"),
        ("Successful requests:", res["completed"]),
        ("Failed requests:", res["failed"]),
        ("Benchmark duration (s):", f"{res['duration']:.2f}"),
        ("Total input tokens:", res["total_input_tokens"]),
        ("Total generated tokens:", res["total_output_tokens"]),
        ("Request throughput (req/s):", f"{res['request_throughput']:.2f}"),
        ("Input token throughput (tok/s):", f"{res['input_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{res['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{res['total_throughput']:.2f}"),
        ("Peak concurrent requests:", res["max_concurrent_requests"]),
    ]

    def f(v):
        return "n/a" if v is None else f"{v:.2f}"

    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    out += [f"{a:<40} {b!s:<10}" for a, b in rows]
    for title, key in (
        ("End-to-End Latency", "e2e_latency"),
        ("Time to First Token", "ttft"),
        ("Time per Output Token (excl. 1st token)", "tpot"),
        ("Inter-Token Latency (per event)", "itl"),
    ):
        out.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        out.append(f"{'Mean ' + key.upper() + ' (ms):':<40} {f(res[f'mean_{key}_ms']):<10}")
        out.append(f"{'Median ' + key.upper() + ' (ms):':<40} {f(res[f'median_{key}_ms']):<10}")
        out.append(f"{'P99 ' + key.upper() + ' (ms):':<40} {f(res[f'p99_{key}_ms']):<10}")
    out.append(f"{'Mean ITL per token (ms):':<40} {f(res['mean_itl_per_token_ms']):<10}")
    out.append(f"{'Mean queue time (ms):':<40} {f(res['mean_queue_time_ms']):<10}")
    out.append(f"{'P99 schedule lag (ms):':<40} {f(res['p99_schedule_lag_ms']):<10}")
    out.append(f"{'Reliable:':<40} {res['reliable']!s:<10}")
    for r in res["reliability"]["reasons"]:
        out.append(f"  unreliable: {r}")
    if res["errors_by_class"]:
        out.append(f"{'Errors by class:':<40} {res['errors_by_class']}")
    out.append("=" * 50)
    return "\n".join(out)
