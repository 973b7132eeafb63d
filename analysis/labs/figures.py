"""Each lab's figures, computed from what its variants left (load.Variant), in emulated units.

Why a separate step: verdicts (verdicts.py) must be pure functions of these figures, so the figures
carry everything a verdict or a reader needs: the statistic in the key name (`_p50`, `_p99`,
`_median`), the unit (`_ms`, `_tok_s`, `_tokens`), and counts (`n`). On enginesim every time is
divided by the server's time scale and every rate multiplied by it (wall -> emulated hardware), so
figures mean the same at any scale; `time_scale` is recorded with them.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np

from analysis.evidence import events, prom, requests, startup
from analysis.labs.load import Run, Variant

_FLUSH_OK = re.compile(r"flush cache: (?P<path>/\S+) succeeded")


def pct(values: list[float], q: float) -> float | None:
    """Percentile with numpy's default linear interpolation; None for no values."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.percentile(finite, q)) if finite else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def ok_reqs(run: Run) -> list[dict[str, Any]]:
    return requests.ok_requests(run.result) if run.result else []


def run_stats(v: Variant, run: Run) -> dict[str, Any]:
    """Latency and throughput of one run (emulated units), with its request counts."""
    s = 1.0 / v.time_scale
    reqs = ok_reqs(run)
    res = run.result or {}
    ttft = [r["ttft_ms"] * s for r in reqs if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] * s for r in reqs if r.get("tpot_ms") is not None]
    e2e = [r["e2e_ms"] * s for r in reqs if r.get("e2e_ms") is not None]
    itl = [g * s for r in reqs for g in token_gaps_ms(r)]
    out_tok = res.get("output_throughput")
    return {
        "status": run.status,
        "n": len(reqs),
        "failed": int(res.get("failed", 0) or 0),
        "reliable": res.get("reliable"),
        "ttft_p50_ms": _r(pct(ttft, 50)),
        "ttft_p95_ms": _r(pct(ttft, 95)),
        "ttft_p99_ms": _r(pct(ttft, 99)),
        "tpot_p50_ms": _r(pct(tpot, 50)),
        "tpot_p99_ms": _r(pct(tpot, 99)),
        "itl_p50_ms": _r(pct(itl, 50)),
        "itl_p99_ms": _r(pct(itl, 99)),
        "e2e_p50_ms": _r(pct(e2e, 50)),
        "e2e_p99_ms": _r(pct(e2e, 99)),
        "output_tok_s": _r(out_tok * v.time_scale if out_tok is not None else None, 1),
        "cached_tokens": [r.get("cached_tokens") for r in reqs],
        "tpot_samples_ms": [_r(x) for x in tpot],
        "ttft_samples_ms": [_r(x) for x in ttft],
    }


def token_gaps_ms(req: dict[str, Any]) -> list[float]:
    """Per-token gaps after the first event (a gap split over the tokens of the later event)."""
    t = req.get("event_times_s") or []
    n = req.get("event_tokens") or [1] * len(t)
    out = []
    for i in range(1, len(t)):
        k = max(int(n[i]) if i < len(n) else 1, 1)
        out.extend([(t[i] - t[i - 1]) * 1000.0 / k] * k)
    return out


def event_gaps_ms(req: dict[str, Any]) -> list[float]:
    """Client-visible gaps between content events (not split per token)."""
    t = req.get("event_times_s") or []
    return [(t[i] - t[i - 1]) * 1000.0 for i in range(1, len(t))]


def flush_proof(run: Run, engine: str | None = None) -> dict[str, Any]:
    """The endpoint's answer as the client logged it (loadgen prints it before the main phase) and,
    with ``engine``, what the server counted afterwards: cached tokens reported by the run's first
    request and the prefix-cache hit counter over the run (both 0 after a real flush)."""
    m = _FLUSH_OK.search(run.bench_log)
    out: dict[str, Any] = {"endpoint_ok": bool(m), "endpoint": m.group("path") if m else None}
    if engine is not None:
        reqs = ok_reqs(run)
        out["first_request_cached_tokens"] = reqs[0].get("cached_tokens") if reqs else None
        out["hit_counter_delta"] = run.delta(*_hit_query_names(engine)[0])
        metric_ok = out["first_request_cached_tokens"] in (0, None) and out["hit_counter_delta"] in (0, None)
        known = out["first_request_cached_tokens"] is not None or out["hit_counter_delta"] is not None
        out["proven"] = bool(m) and known and metric_ok
    return out


# ---------------------------------------------------------------- per lab


def sweep(variants: dict[str, Variant]) -> dict[str, Any]:
    """eager_vs_graph and decode_sweep: per variant, per concurrency."""
    out: dict[str, Any] = {}
    for name, v in variants.items():
        rows = {}
        for run in v.runs.values():
            st = run_stats(v, run)
            st["concurrency"] = run.workload.get("concurrency")
            rows[run.name] = st
        out[name] = rows
    return {"variants": out}


def prefill(variants: dict[str, Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        rows = {}
        for run in v.runs.values():
            st = run_stats(v, run)
            rates = [
                r["input_tokens"] / (r["ttft_ms"] / v.time_scale / 1000.0)
                for r in ok_reqs(run)
                if r.get("ttft_ms") and r.get("input_tokens")
            ]
            st["isl"] = run.workload.get("isl")
            st["prefill_tok_s_p50"] = _r(pct(rates, 50), 1)
            st["max_cached_tokens"] = max((c or 0 for c in st["cached_tokens"]), default=None)
            rows[run.name] = st
        out[name] = rows
    return {"variants": out}


def _hit_query_names(engine: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if engine == "vllm":
        return (
            ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        )
    return (("sglang:cached_tokens_total",), ("sglang:prompt_tokens_total",))


def prefix(variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    hits, queries = _hit_query_names(engine)
    out: dict[str, Any] = {}
    for name, v in variants.items():
        row: dict[str, Any] = {}
        for key in ("identical_first", "identical_second"):
            run = v.runs.get(key)
            if run is None:
                continue
            st = run_stats(v, run)
            row[key] = {
                "status": run.status,
                "ttft_ms": st["ttft_p50_ms"],
                "cached_tokens": st["cached_tokens"][0] if st["cached_tokens"] else None,
                "hit_delta": run.delta(*hits),
                "query_delta": run.delta(*queries),
                "flush": flush_proof(run) if run.workload and key == "identical_first" else None,
            }
        chat, warm = v.runs.get("chat"), v.runs.get("chat_warm")
        if chat is not None:
            st = run_stats(v, chat)
            cached = [c for c in st["cached_tokens"] if c is not None]
            row["chat"] = {
                "status": chat.status,
                "n": st["n"],
                "ttft_p50_ms": st["ttft_p50_ms"],
                "ttft_p95_ms": st["ttft_p95_ms"],
                "ttft_p99_ms": st["ttft_p99_ms"],
                "cached_tokens_median": _r(pct(cached, 50), 1),
                "cached_tokens_min": min(cached) if cached else None,
                "hit_delta": chat.delta(*hits),
                "query_delta": chat.delta(*queries),
                "warm_flush": flush_proof(warm) if warm is not None else None,
                "warm_cached_tokens": (run_stats(v, warm)["cached_tokens"] or [None])[0] if warm else None,
                "ttft_samples_ms": st["ttft_samples_ms"],
            }
        out[name] = row
    return {"variants": out, "counters": {"hits": hits[0], "queries": queries[0]}}


def _chunk_rep(v: Variant, run: Run) -> dict[str, Any]:
    """One repetition: the stream's gaps before the injection and during it."""
    s = 1.0 / v.time_scale
    reqs = {r["index"]: r for r in ok_reqs(run)}
    if 0 not in reqs or 1 not in reqs:
        return {"valid": False, "why": f"{run.name}: stream or injection did not complete ({run.status})"}
    stream, inj = reqs[0], reqs[1]
    times = [stream["send_s"] + t for t in stream.get("event_times_s") or []]
    inj_send = inj["send_s"]
    inj_end = inj_send + (inj["e2e_ms"] or 0.0) / 1000.0
    before = [t for t in times if t <= inj_send]
    k = len(before)
    gaps_before = [(b - a) * 1000.0 * s for a, b in itertools.pairwise(before)]
    # a gap overlaps the injection when its interval [a, b] meets [send, end]
    during = [(b - a) * 1000.0 * s for a, b in itertools.pairwise(times) if b >= inj_send and a <= inj_end]
    after_end = [t for t in times if t > inj_end]
    rep = {
        "valid": True,
        "events_before_injection": k,
        "median_gap_before_ms": _r(pct(gaps_before, 50)),
        "mean_gap_before_ms": _r(float(np.mean(gaps_before)) if gaps_before else None),
        "max_gap_during_ms": _r(max(during) if during else None),
        "injection_e2e_ms": _r((inj["e2e_ms"] or 0.0) * s),
        "stream_events_after_injection": len(after_end),
        "timeline": {
            "t_ms": [_r((t - times[0]) * 1000.0 * s, 2) for t in times],
            "injection_ms": [
                _r((inj_send - times[0]) * 1000.0 * s, 2),
                _r((inj_end - times[0]) * 1000.0 * s, 2),
            ],
        }
        if times
        else None,
    }
    if k < 2:
        rep.update(
            valid=False, why=f"{run.name}: the injection went out after {k} stream event(s), too early"
        )
    elif not after_end:
        rep.update(
            valid=False, why=f"{run.name}: the stream ended before the injection finished (no overlap end)"
        )
    elif not during:
        rep.update(valid=False, why=f"{run.name}: no stream gap overlaps the injection")
    return rep


def chunk(variants: dict[str, Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        reps = {run.name: _chunk_rep(v, run) for run in v.runs.values() if run.name != "probe"}
        valid = [r for r in reps.values() if r["valid"]]
        med = pct([r["median_gap_before_ms"] for r in valid if r["median_gap_before_ms"] is not None], 50)
        mean = pct([r["mean_gap_before_ms"] for r in valid if r["mean_gap_before_ms"] is not None], 50)
        mx = pct([r["max_gap_during_ms"] for r in valid], 50)
        basis = med if med else mean
        out[name] = {
            "reps": reps,
            "valid_reps": len(valid),
            "median_gap_before_ms": _r(med),
            "mean_gap_before_ms": _r(mean),
            "max_gap_during_ms_median": _r(mx),
            "injection_e2e_ms_median": _r(pct([r["injection_e2e_ms"] for r in valid], 50)),
            "events_before_injection": [r.get("events_before_injection") for r in reps.values()],
            "stall_ratio": _r(mx / basis if mx is not None and basis else None, 2),
            "stall_ratio_basis": "median gap before"
            if med
            else "mean gap before (median was 0: events coalesced)",
        }
    return {"variants": out}


def budget(variants: dict[str, Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        s = 1.0 / v.time_scale
        tpots: list[float] = []
        max_gaps: list[float] = []
        ttfts: list[float] = []
        long_e2e: list[float] = []
        for run in v.runs.values():
            reqs = ok_reqs(run)
            n_short = int(run.workload.get("short_count", len(reqs) - 1))
            shorts = [r for r in reqs if r["index"] < n_short]
            longs = [r for r in reqs if r["index"] >= n_short]
            tpots += [r["tpot_ms"] * s for r in shorts if r.get("tpot_ms") is not None]
            ttfts += [r["ttft_ms"] * s for r in shorts if r.get("ttft_ms") is not None]
            gaps = [g * s for r in shorts for g in event_gaps_ms(r)]
            if gaps:
                max_gaps.append(max(gaps))
            long_e2e += [r["e2e_ms"] * s for r in longs if r.get("e2e_ms") is not None]
        out[name] = {
            "short_tpot_p99_ms": _r(pct(tpots, 99)),
            "short_tpot_p50_ms": _r(pct(tpots, 50)),
            "short_ttft_p99_ms": _r(pct(ttfts, 99)),
            "short_max_gap_ms_median": _r(pct(max_gaps, 50)),
            "long_e2e_ms_median": _r(pct(long_e2e, 50)),
            "reps": len(max_gaps),
            "tpot_samples_ms": [_r(x) for x in tpots],
        }
    return {"variants": out}


_KV_NAMES = {
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "usage": ("sglang:token_usage",),
        "preempt": ("sglang:num_retracted_requests_total",),
        "queue_sum": ("sglang:queue_time_seconds_sum",),
        "queue_count": ("sglang:queue_time_seconds_count",),
    },
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "preempt": ("vllm:num_preemptions_total",),
        "queue_sum": ("vllm:request_queue_time_seconds_sum",),
        "queue_count": ("vllm:request_queue_time_seconds_count",),
    },
}


def kv(variants: dict[str, Variant], engine: str, full_threshold: float) -> dict[str, Any]:
    names = _KV_NAMES[engine]
    out: dict[str, Any] = {}
    for name, v in variants.items():
        cap = startup.capacity(v.server_log, engine)
        log_ev = events.scan(v.server_log)
        runs = {}
        for run in v.runs.values():
            s = 1.0 / v.time_scale
            usage = prom.series(run.samples, "peak", *names["usage"])
            running = prom.series(run.samples, "total", *names["running"])
            waiting = prom.series(run.samples, "total", *names["waiting"])
            qsum, qcount = run.delta(*names["queue_sum"]), run.delta(*names["queue_count"])
            reqs = ok_reqs(run)
            t0 = run.samples[0].time if run.samples else 0.0
            runs[run.name] = {
                "status": run.status,
                "n": len(reqs),
                "expected": run.workload.get("num_prompts"),
                "preemptions": run.delta(*names["preempt"]),
                "server_queue_time_mean_ms": _r(
                    qsum / qcount * 1000.0 * s if qsum is not None and qcount else None
                ),
                "client_queue_time_mean_ms": _r(
                    float(np.mean([r["queue_time_ms"] * s for r in reqs])) if reqs else None
                ),
                "ttft_p50_ms": _r(pct([r["ttft_ms"] * s for r in reqs if r.get("ttft_ms") is not None], 50)),
                "samples": len(run.samples),
                "max_kv_usage": _r(max((u for _, u in usage), default=None)),
                "max_running": max((x for _, x in running), default=None),
                "max_waiting": max((x for _, x in waiting), default=None),
                "timeline": {
                    "t_s": [_r((t - t0) * s, 3) for t, _ in usage],
                    "kv_usage": [_r(u, 4) for _, u in usage],
                    "running": [x for _, x in running],
                    "waiting": [x for _, x in waiting],
                },
            }
        proofs = []
        for rname, r in runs.items():
            if r["max_kv_usage"] is not None and r["max_kv_usage"] >= full_threshold:
                proofs.append(
                    f"{rname}: sampled KV usage reached {r['max_kv_usage']:.2f} (>= {full_threshold:g})"
                )
        if log_ev.max_kv_usage is not None and log_ev.max_kv_usage >= full_threshold:
            proofs.append(f"server log: KV usage {log_ev.max_kv_usage:.2f} in {log_ev.kv_usage_line!r}")
        if log_ev.retraction_lines:
            proofs.append(f"server log: {log_ev.retraction_lines[0]!r}")
        out[name] = {
            "capacity": cap.as_dict() if cap else None,
            "runs": runs,
            "log": log_ev.as_dict(),
            "kv_full_proofs": proofs,
        }
    return {"variants": out, "full_threshold": full_threshold}


def fp8(variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        cap = startup.capacity(v.server_log, engine)
        capped = "--max-total-tokens" in v.args or "--num-gpu-blocks-override" in v.args
        out[name] = {
            "capacity": cap.as_dict() if cap else None,
            "kv_dtype_flag": _flag(v.args, "--kv-cache-dtype") or "auto (not passed)",
            "capacity_capped_by_flag": capped,
            "fp8_platform_notes": startup.fp8_notes(v.server_log),
        }
    return {"variants": out}


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


_SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def ngram(variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, v in variants.items():
        s = 1.0 / v.time_scale
        kinds: dict[str, Any] = {}
        for kind in ("repetitive", "prose"):
            runs = [r for r in v.runs.values() if r.workload.get("prompt") == kind]
            reqs = [q for r in runs for q in ok_reqs(r)]
            e2e = [q["e2e_ms"] * s for q in reqs if q.get("e2e_ms") is not None]
            tpot = [q["tpot_ms"] * s for q in reqs if q.get("tpot_ms") is not None]
            if engine == "vllm":
                deltas = {n: _sum([r.delta(n) for r in runs]) for n in _SPEC}
                acc = requests.vllm_acceptance(deltas)
            else:
                acc = requests.sglang_acceptance(reqs)
            kinds[kind] = {
                "samples": len(runs),
                "ok": len(reqs),
                "flushes_proven": sum(1 for r in runs if flush_proof(r, engine)["proven"]),
                "e2e_p50_ms": _r(pct(e2e, 50)),
                "tpot_p50_ms": _r(pct(tpot, 50)),
                "acceptance": acc.as_dict() if acc else None,
            }
        tp = v.runs.get("throughput")
        out[name] = {
            "prompts": kinds,
            "throughput_output_tok_s": run_stats(v, tp)["output_tok_s"] if tp is not None else None,
            "throughput_status": tp.status if tp is not None else None,
        }
    return {"variants": out}


def _sum(values: list[float | None]) -> float | None:
    known = [x for x in values if x is not None]
    return float(sum(known)) if known and len(known) == len(values) else None


def compute(
    lab: str, engine: str, variants: dict[str, Variant], thresholds: dict[str, Any]
) -> dict[str, Any]:
    """The figures of ``lab`` (dispatch)."""
    if lab in ("eager_vs_graph", "decode_sweep"):
        return sweep(variants)
    if lab == "prefill_sweep":
        return prefill(variants)
    if lab == "prefix_cache":
        return prefix(variants, engine)
    if lab == "chunk_interference":
        return chunk(variants)
    if lab == "token_budget":
        return budget(variants)
    if lab == "kv_pressure":
        return kv(variants, engine, float(thresholds.get("kv_full", 0.9)))
    if lab == "fp8_kv":
        return fp8(variants, engine)
    if lab == "ngram_spec":
        return ngram(variants, engine)
    raise ValueError(lab)
