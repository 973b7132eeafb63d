"""Synthetic result files and run directories for the analysis tests (values known in advance)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _stats(prefix: str, values_ms: np.ndarray, out: dict[str, Any], suffix: str = "_ms") -> None:
    out[f"mean_{prefix}{suffix}"] = float(values_ms.mean())
    out[f"median_{prefix}{suffix}"] = float(np.median(values_ms))
    out[f"std_{prefix}{suffix}"] = float(values_ms.std())
    for q in (90, 95, 99):
        out[f"p{q}_{prefix}{suffix}"] = float(np.percentile(values_ms, q))


def loadgen_result(
    n: int = 40,
    isl: int = 128,
    osl: int = 16,
    conc: int = 8,
    seed: int = 0,
    t0: float = 1_800_000_000.0,
    itl_ms: float = 10.0,
    slow_after_s: float | None = None,
    slow_factor: float = 3.0,
    n_failed: int = 0,
    tokens_per_event: int = 1,
) -> dict[str, Any]:
    """A quickmap.loadgen/1 object with per-request records and event arrays."""
    rng = np.random.default_rng(seed)
    reqs = []
    ttfts, e2es, tpots, itls_all = [], [], [], []
    main_start = 0.5
    for i in range(n):
        send = main_start + (i // conc) * (osl * itl_ms / 1000.0 + 0.05)
        ttft = 0.05 + rng.random() * 0.02
        n_events = osl // tokens_per_event
        gaps = rng.gamma(50, itl_ms / 1000.0 / 50, n_events - 1) * tokens_per_event
        times = np.concatenate(([ttft], ttft + np.cumsum(gaps)))
        if slow_after_s is not None:
            abs_t = send + times
            slow = abs_t > slow_after_s
            extra = np.where(slow[1:], gaps * (slow_factor - 1), 0)
            times = np.concatenate(([ttft], ttft + np.cumsum(gaps + extra)))
        failed = i < n_failed
        rec: dict[str, Any] = {
            "index": i,
            "scheduled_s": send,
            "send_s": send,
            "queue_time_ms": 0.0,
            "schedule_lag_ms": 0.1,
            "input_tokens": isl,
            "tokens_source": "server",
            "success": not failed,
            "error_class": "http_status" if failed else None,
            "error": "HTTP 500" if failed else None,
            "http_status": 500 if failed else 200,
        }
        if failed:
            rec.update(
                ttft_ms=None, e2e_ms=None, tpot_ms=None, output_tokens=0, event_times_s=[], event_tokens=[]
            )
        else:
            e2e = times[-1]
            rec.update(
                ttft_ms=ttft * 1000,
                e2e_ms=e2e * 1000,
                tpot_ms=(e2e - ttft) * 1000 / (osl - 1),
                output_tokens=osl,
                event_times_s=times.tolist(),
                event_tokens=[tokens_per_event] * n_events,
            )
            ttfts.append(ttft * 1000)
            e2es.append(e2e * 1000)
            tpots.append(rec["tpot_ms"])
            per_tok = np.repeat(np.diff(times) / tokens_per_event, tokens_per_event)
            itls_all.append(per_tok * 1000)
        reqs.append(rec)
    ok = [r for r in reqs if r["success"]]
    main_end = max(r["send_s"] + (r["e2e_ms"] or 0) / 1000 for r in reqs)
    duration = main_end - main_start
    out: dict[str, Any] = {
        "schema": "quickmap.loadgen/1",
        "tool": {"name": "loadgen", "version": "0.1.0"},
        "complete": True,
        "reliable": True,
        "reliability": {"loop_lag_ms": {"p50": 0.1, "p99": 1, "max": 2}, "reasons": []},
        "backend": "sglang",
        "model": "m",
        "random_input_len": isl,
        "random_output_len": osl,
        "num_prompts": n,
        "max_concurrency": conc,
        "request_rate": None,
        "t0_epoch_s": t0,
        "main_start_s": main_start,
        "main_end_s": main_end,
        "duration": duration,
        "completed": len(ok),
        "failed": n - len(ok),
        "total_input_tokens": isl * len(ok),
        "total_output_tokens": osl * len(ok),
        "request_throughput": len(ok) / duration,
        "input_throughput": isl * len(ok) / duration,
        "output_throughput": osl * len(ok) / duration,
        "total_throughput": (isl + osl) * len(ok) / duration,
        "errors_by_class": {"http_status": n - len(ok)} if n_failed else {},
        "server_metrics": None,
        "requests": reqs,
    }
    _stats("ttft", np.array(ttfts), out)
    _stats("tpot", np.array(tpots), out)
    per_token = np.concatenate(itls_all)
    per_event = np.concatenate([np.diff(r["event_times_s"]) * 1000 for r in ok])
    _stats("itl", per_event, out)  # loadgen: *_itl_ms = one sample per content event
    out["mean_itl_per_token_ms"] = float(per_token.mean())
    out["median_itl_per_token_ms"] = float(np.median(per_token))
    out["p99_itl_per_token_ms"] = float(np.percentile(per_token, 99))
    # --output-details arrays (SGLang layout: ttfts in s, itls per token in s), failed requests included
    out["ttfts"] = [(r["ttft_ms"] or 0.0) / 1000 for r in reqs]
    out["itls"] = [
        np.repeat(np.diff(r["event_times_s"]) / tokens_per_event, tokens_per_event).tolist()
        if r["success"]
        else []
        for r in reqs
    ]
    out["output_lens"] = [r["output_tokens"] for r in reqs]
    _stats("e2e_latency", np.array(e2es), out)
    return out


def sglang_result(
    n: int = 50, osl: int = 9, seed: int = 1, details: bool = True, n_failed: int = 0
) -> dict[str, Any]:
    """An SGLang bench_serving JSONL object (details arrays in seconds)."""
    rng = np.random.default_rng(seed)
    ttfts = rng.gamma(10, 0.005, n)
    itls = rng.gamma(20, 0.0005, (n, osl - 1))
    ok = np.ones(n, bool)
    ok[:n_failed] = False
    lat = ttfts + itls.sum(axis=1)
    tpot = itls.mean(axis=1)
    out: dict[str, Any] = {
        "tag": None,
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": float("inf"),
        "max_concurrency": 16,
        "random_input_len": 64,
        "random_output_len": osl,
        "server_info": None,
        "duration": 2.0,
        "completed": int(ok.sum()),
        "total_input_tokens": int(64 * ok.sum()),
        "total_output_tokens": int(osl * ok.sum()),
        "total_output_tokens_retokenized": int(osl * ok.sum()),
        "request_throughput": ok.sum() / 2.0,
        "input_throughput": 64 * ok.sum() / 2.0,
        "output_throughput": osl * ok.sum() / 2.0,
        "total_throughput": (64 + osl) * ok.sum() / 2.0,
    }
    _stats("e2e_latency", lat[ok] * 1000, out)
    _stats("ttft", ttfts[ok] * 1000, out)
    _stats("tpot", tpot[ok] * 1000, out)
    _stats("itl", itls[ok].ravel() * 1000, out)
    if details:
        itl_lists = [row.tolist() if k else [] for row, k in zip(itls, ok, strict=True)]
        out.update(
            input_lens=[64] * n,
            output_lens=[osl if k else 0 for k in ok],
            ttfts=[float(t) if k else 0.0 for t, k in zip(ttfts, ok, strict=True)],
            itls=itl_lists,
            generated_texts=["x" if k else "" for k in ok],
            errors=["" if k else "Connection reset" for k in ok],
        )
    out["_truth"] = {"ttft_ms": ttfts[ok] * 1000, "e2e_ms": lat[ok] * 1000, "tpot_ms": tpot[ok] * 1000,
                     "itl_ms": itls[ok].ravel() * 1000}  # fmt: skip
    return out


def dump_sglang(obj: dict[str, Any]) -> str:
    """SGLang writes json.dumps (Infinity for inf) one object per line."""
    clean = {k: v for k, v in obj.items() if k != "_truth"}
    return json.dumps(clean) + "\n"


def write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def meta(case_id: str, rep: int, status: str = "completed", **kw: Any) -> dict[str, Any]:
    base = {"case_id": case_id, "rep": rep, "status": status, "suite": "fixed", "stage": "short_decode",
            "isl": 128, "osl": 16, "concurrency": 8, "num_prompts": 40, "warmup": 0}  # fmt: skip
    base.update(kw)
    return base


def make_run(root: Path, reps: int = 2, bg_overlaps: bool = True) -> Path:
    """A small run: 2 fixed cases × reps, mixed × reps (loadgen), plus a foreign SGLang result."""
    run = root / "run1"
    write_json(run / "manifest.json", {"run_id": "run1", "model": "m", "status": "completed"})
    for case, conc in (("short_c8", 8), ("short_c16", 16)):
        for rep in range(1, reps + 1):
            d = run / "cases" / case / f"rep{rep}"
            write_json(d / "meta.json", meta(case, rep, concurrency=conc))
            write_json(d / "bench.json", loadgen_result(conc=conc, seed=rep * 10 + conc))
    t0 = 1_800_000_000.0
    for rep in range(1, reps + 1):
        base = run / "mixed" / f"rep{rep}"
        mk = {"suite": "mixed", "stage": "mixed", "isl": 128, "osl": 16, "concurrency": 8, "num_prompts": 40}
        write_json(base / "control" / "meta.json", meta("mixed", rep, role="control", **mk))
        write_json(base / "control" / "bench.json", loadgen_result(seed=100 + rep, t0=t0))
        bg = loadgen_result(seed=200 + rep, t0=t0 + 100, slow_after_s=0.9)
        inj_at = t0 + 100 + (0.9 if bg_overlaps else bg["main_end_s"] + 5)
        write_json(
            base / "decode_background" / "meta.json", meta("mixed", rep, role="decode_background", **mk)
        )
        write_json(base / "decode_background" / "bench.json", bg)
        inj = loadgen_result(n=1, isl=4096, osl=2, conc=1, seed=300 + rep, t0=inj_at - 0.5)
        write_json(
            base / "prefill_injection" / "meta.json",
            meta("mixed", rep, role="prefill_injection", suite="mixed", stage="mixed",
                 isl=4096, osl=2, concurrency=1, num_prompts=1, injection_sent_epoch_s=inj_at),
        )  # fmt: skip
        write_json(base / "prefill_injection" / "bench.json", inj)
    foreign = run / "cases" / "foreign_sglang" / "rep1" / "bench.json"
    foreign.parent.mkdir(parents=True)
    foreign.write_text(dump_sglang(sglang_result()))
    return run
