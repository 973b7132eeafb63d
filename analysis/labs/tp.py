"""tp_scaling: throughput per TP size and request rate, the scaling efficiency, the knee, and the
communication share of the forward pass read from each variant's profiler trace.

Why computed here and never typed in: efficiency is `throughput(TP=n) / (n x throughput(TP=1))` at
the same offered rate, read from the measured runs; below the knee every size delivers the offered
load, so there it is 1/n by construction, and the verdict reads it at the highest rate only.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from analysis.errors import InputError
from analysis.evidence import trace
from analysis.labs.figures import run_stats
from analysis.labs.load import Variant
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Verdict

# The knee: the first rate whose median TTFT is more than this many times the lowest rate's (requests
# queue for prefill). Not the achieved request rate: with a finite prompt count it always trails the
# offered rate by the last requests' own latency.
KNEE_TTFT_FACTOR = 2.0


def efficiency(throughput_n: float | None, n: int, throughput_1: float | None) -> float | None:
    """Scaling efficiency of TP=n against TP=1 at matched load: thr(n) / (n * thr(1))."""
    if throughput_n is None or throughput_1 is None or throughput_1 <= 0 or n < 1:
        return None
    return throughput_n / (n * throughput_1)


def knee(rows: list[dict[str, Any]]) -> float | None:
    """The lowest offered rate at which requests queue: TTFT p50 above KNEE_TTFT_FACTOR x the lowest
    rate's TTFT p50 (None: no rate queued, or the lowest rate has no TTFT)."""
    ordered = sorted(rows, key=lambda x: x["rate"])
    if not ordered or not ordered[0].get("ttft_p50_ms"):
        return None
    floor = ordered[0]["ttft_p50_ms"]
    for row in ordered[1:]:
        t = row.get("ttft_p50_ms")
        if t is not None and t > KNEE_TTFT_FACTOR * floor:
            return row["rate"]
    return None


def _tp(v: Variant, spec: dict[str, Any]) -> int:
    tp = (spec.get("engine_vars") or {}).get("engine_tp_size")
    if tp is None and v.server_info:
        tp = v.server_info.get("tp_size") or v.server_info.get("tensor_parallel_size")
    return int(tp or 1)


def _trace(vdir: Path) -> dict[str, Any]:
    files = sorted(vdir.glob("runs/*/trace/*.json*"))
    if not files:
        return {"status": "no trace file", "files": []}
    try:
        s = trace.summarize(trace.load(files[-1]))
    except InputError as exc:
        return {"status": f"unreadable: {exc}", "files": [f.name for f in files]}
    return {"status": "read", "files": [f.name for f in files], "summary": s.as_dict()}


def figures(lab_dir: Path, plan: dict[str, Any], variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    specs = {s["name"]: s for s in plan["variants"]}
    out: dict[str, Any] = {}
    for name, v in variants.items():
        tp = _tp(v, specs[name])
        s = 1.0 / v.time_scale
        rows = []
        for run in v.runs.values():
            st = run_stats(v, run)
            res = run.result or {}
            dur = res.get("duration")
            done = res.get("completed")
            achieved = done / (dur * s) if dur and done else None
            rows.append(
                {
                    "run": run.name,
                    "rate": run.workload.get("request_rate"),
                    "n": st["n"],
                    "achieved_req_s": round(achieved, 3) if achieved else None,
                    "output_tok_s": st["output_tok_s"],
                    "output_tok_s_per_gpu": round(st["output_tok_s"] / tp, 1) if st["output_tok_s"] else None,
                    "ttft_p50_ms": st["ttft_p50_ms"],
                    "ttft_p99_ms": st["ttft_p99_ms"],
                    "tpot_p50_ms": st["tpot_p50_ms"],
                    "tpot_p99_ms": st["tpot_p99_ms"],
                }
            )
        rows.sort(key=lambda x: x["rate"] or 0)
        vdir = lab_dir / name
        topo = vdir / "topology.txt"
        out[name] = {
            "tp": tp,
            "rates": rows,
            "knee_req_s": knee([r for r in rows if r["rate"] is not None]),
            "trace": _trace(vdir),
            "topology": topo.read_text().strip()
            if topo.is_file()
            else "not measured (no nvidia-smi topo -m)",
        }
    base = next((v for v in out.values() if v["tp"] == 1), None)
    eff: dict[str, dict[str, float | None]] = {}
    for name, v in out.items():
        per_rate = {}
        for row in v["rates"]:
            ref = next((r for r in (base or {}).get("rates", []) if r["rate"] == row["rate"]), None)
            e = efficiency(row["output_tok_s"], v["tp"], ref["output_tok_s"] if ref else None)
            per_rate[str(row["rate"])] = round(e, 4) if e is not None else None
        eff[name] = per_rate
    return {
        "variants": out,
        "efficiency": eff,
        "formula": "throughput(TP=n) / (n x throughput(TP=1)), same rate",
    }


def judge(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    """Supported when total throughput at the top rate rises with TP and the NCCL share rises with it."""
    vs = sorted(fig["variants"].items(), key=lambda kv: kv[1]["tp"])
    if not vs or vs[0][1]["tp"] != 1 or len(vs) < 2:
        return Verdict(INCONCLUSIVE, "needs TP=1 and at least one larger TP size", [], [])
    top = max(r["rate"] for _, v in vs for r in v["rates"] if r["rate"] is not None)
    obs, checks = [], []
    thr, nccl = [], []
    for name, v in vs:
        row = next((r for r in v["rates"] if r["rate"] == top), {})
        share = ((v["trace"].get("summary") or {}).get("shares") or {}).get("nccl")
        thr.append(row.get("output_tok_s"))
        nccl.append(share)
        e = fig["efficiency"][name].get(str(top))
        obs.append(
            f"TP={v['tp']}: output {row.get('output_tok_s')} tok/s total, "
            f"{row.get('output_tok_s_per_gpu')} per GPU at {top} req/s offered (random "
            f"{wl.get('isl')}/{wl.get('osl')}, {wl.get('num_prompts')} prompts); efficiency {e}; "
            f"TTFT p99 {row.get('ttft_p99_ms')} ms, TPOT p99 {row.get('tpot_p99_ms')} ms; knee "
            f"{v['knee_req_s'] or 'not reached'} req/s; NCCL share of the traced GPU window {share}"
        )
    if any(x is None for x in thr):
        return Verdict(INCONCLUSIVE, f"a TP size has no throughput at {top} req/s", obs, [])
    if any(x is None for x in nccl):
        return Verdict(
            INCONCLUSIVE, "a TP size has no readable profiler trace (no communication share)", obs, []
        )
    rises = all(b > a for a, b in itertools.pairwise(thr))
    comm = all(b > a for a, b in itertools.pairwise(nccl)) and nccl[0] == 0
    checks.append(("throughput rises with TP", rises))
    checks.append(("NCCL share is 0 at TP=1 and rises with TP", comm))
    why = "; ".join(f"{c}: {'yes' if ok else 'no'}" for c, ok in checks)
    if rises and comm:
        return Verdict(SUPPORTED, why, obs, [])
    return Verdict(NOT_SUPPORTED, why, obs, [])


def pitfalls(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    out = [
        "below a size's knee it delivers the offered load, so efficiency there is about 1/n by construction; "
        "read it at the highest rate, past TP=1's knee",
        "DP comparison point (n instances at TP=1 behind one client) not run: the labs start one server per "
        "variant",
    ]
    for name, v in fig["variants"].items():
        if v["knee_req_s"] is None:
            out.append(
                f"{name}: no queueing at any rate (TTFT p50 within {KNEE_TTFT_FACTOR:g}x the lowest rate's): "
                f"its knee lies above {max(r['rate'] for r in v['rates'])} req/s"
            )
        if v["trace"]["status"] != "read":
            out.append(f"{name}: profiler trace {v['trace']['status']}")
        elif v["trace"]["summary"]["emulated"]:
            out.append(f"{name}: the trace is enginesim's cost model (kernel times priced, not measured)")
        if isinstance(v["topology"], str) and v["topology"].startswith("not measured"):
            out.append(f"{name}: GPU topology {v['topology']}")
    return out
