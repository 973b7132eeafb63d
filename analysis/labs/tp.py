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


# The engines' data-parallel flags (SGLang --dp-size and its aliases, vLLM --data-parallel-size / -dp).
DP_FLAGS = ("--dp-size", "--data-parallel-size", "--dp", "-dp")


def dp_ratio(throughput_dp: float | None, throughput_tp: float | None) -> float | None:
    """DP=n against TP=n on the same n GPUs at matched load: thr(DP=n) / thr(TP=n) (> 1: DP delivers more)."""
    if throughput_dp is None or throughput_tp is None or throughput_tp <= 0:
        return None
    return throughput_dp / throughput_tp


def _dp(spec: dict[str, Any]) -> int:
    """The variant's data-parallel size, from its own flags (1 when it has none)."""
    args = [str(a) for a in spec.get("args") or []]
    for i, a in enumerate(args):
        flag, _, value = a.partition("=")
        if flag in DP_FLAGS:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            if not value.isdigit() or int(value) < 1:
                raise InputError(
                    None, f"tp_scaling.{spec.get('name')}.args", f"{a} {value!r}: expected an integer >= 1"
                )
            return int(value)
    return 1


def dp_comparison(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each DP point (n replicas at TP=1) against the TP=n variant, rate by rate: throughput, its ratio,
    and the latency percentiles side by side."""
    out: dict[str, Any] = {}
    by_tp = {v["tp"]: (name, v) for name, v in variants.items() if v.get("dp", 1) == 1}
    for name, v in variants.items():
        n = v.get("dp", 1)
        if n == 1 or v["tp"] != 1:
            continue
        if n not in by_tp:
            out[name] = {
                "dp": n,
                "against": None,
                "status": f"no TP={n} variant to compare with",
                "rates": [],
            }
            continue
        tp_name, t = by_tp[n]
        tp_rows = {r["rate"]: r for r in t["rates"]}
        rows = []
        for r in v["rates"]:
            ref = tp_rows.get(r["rate"])
            if ref is None:
                continue
            ratio = dp_ratio(r.get("output_tok_s"), ref.get("output_tok_s"))
            row: dict[str, Any] = {
                "rate": r["rate"],
                "dp_over_tp_output_tok_s": round(ratio, 4) if ratio else None,
            }
            for key in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
                row[f"dp_{key}"] = r.get(key)
                row[f"tp_{key}"] = ref.get(key)
            rows.append(row)
        out[name] = {"dp": n, "against": tp_name, "status": "compared", "rates": rows}
    return out


def _wins(rows: list[dict[str, Any]], key: str, lower: bool) -> str:
    """Which side wins `key` at each rate: 'DP at 5, 10; TP at 50' (ties and missing values left out)."""
    dp, tp = [], []
    for r in rows:
        a, b = r.get(f"dp_{key}"), r.get(f"tp_{key}")
        if a is None or b is None or a == b:
            continue
        (dp if (a < b) == lower else tp).append(f"{r['rate']:g}")
    parts = [f"{side} at {', '.join(rates)} req/s" for side, rates in (("DP", dp), ("TP", tp)) if rates]
    return "; ".join(parts) or "neither (equal or not measured)"


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
        dp = _dp(specs[name])
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
                    "output_tok_s_per_gpu": round(st["output_tok_s"] / (tp * dp), 1)
                    if st["output_tok_s"]
                    else None,
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
            "dp": dp,
            "gpus": tp * dp,
            "rates": rows,
            "knee_req_s": knee([r for r in rows if r["rate"] is not None]),
            "trace": _trace(vdir),
            "topology": topo.read_text().strip()
            if topo.is_file()
            else "not measured (no nvidia-smi topo -m)",
        }
    base = next((v for v in out.values() if v["tp"] == 1 and v["dp"] == 1), None)
    eff: dict[str, dict[str, float | None]] = {}
    for name, v in out.items():
        if v["dp"] > 1:
            continue  # a DP point is compared with TP=n (dp_vs_tp), not scaled against TP=1
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
        "dp_vs_tp": dp_comparison(out),
        "dp_formula": "throughput(DP=n replicas at TP=1) / throughput(TP=n), same rate",
    }


def judge(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    """Supported when total throughput at the top rate rises with TP and the NCCL share rises with it."""
    vs = sorted(
        ((k, v) for k, v in fig["variants"].items() if v.get("dp", 1) == 1), key=lambda kv: kv[1]["tp"]
    )
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
    obs.extend(_dp_observations(fig, wl))
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


def _dp_observations(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    """One line per DP point: the throughput ratio at each rate and which side wins where."""
    out = []
    for name, c in (fig.get("dp_vs_tp") or {}).items():
        if not c["rates"]:
            out.append(f"{name} (DP={c['dp']} at TP=1): {c['status']}")
            continue
        ratios = ", ".join(f"{r['dp_over_tp_output_tok_s']} at {r['rate']:g}" for r in c["rates"])
        out.append(
            f"DP={c['dp']} replicas at TP=1 vs TP={c['dp']} ({c['against']}), random "
            f"{wl.get('isl')}/{wl.get('osl')}, {wl.get('num_prompts')} prompts per rate: output throughput "
            f"ratio DP/TP {ratios} req/s; higher output throughput: "
            f"{_wins(c['rates'], 'output_tok_s', lower=False)}; lower TTFT p99: "
            f"{_wins(c['rates'], 'ttft_p99_ms', lower=True)}; lower TPOT p50: "
            f"{_wins(c['rates'], 'tpot_p50_ms', lower=True)}"
        )
    return out


def pitfalls(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    out = [
        "below a size's knee it delivers the offered load, so efficiency there is about 1/n by construction; "
        "read it at the highest rate, past TP=1's knee",
    ]
    dp_points = fig.get("dp_vs_tp") or {}
    if not dp_points:
        out.append("no DP comparison point ran (labs_tp_dp_size is 0 or 1)")
    for name, c in dp_points.items():
        out.append(
            f"{name}: one server with {c['dp']} data-parallel ranks behind its one endpoint (the engine's "
            "own dispatch), not separate servers behind an external router; below both knees DP and TP "
            "deliver "
            "the same offered load, so the throughput ratio there is about 1 by construction"
        )
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
