"""pd_disagg: P/D disaggregation against one instance on the same GPUs, per workload, and the break-even.

Why per workload: disaggregation keeps prefills off the decode instance (steadier TPOT) but pays a KV
transfer and a router hop per request (TTFT) and halves the GPUs each phase gets; which side wins moves
with the prompt and output lengths, so the lab reports TTFT / TPOT / output throughput of both variants
on every corner of the grid and names where P/D wins and where it loses (the break-even). A P/D figure
counts only when the launch record says it was measured through the router, and the KV transfers of
each run (both sides' /metrics, kv_transfer.py) are reported next to it: a P/D run whose requests were
not transferred did not test disaggregation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis.evidence import kv_transfer, prom
from analysis.labs.figures import run_stats
from analysis.labs.load import Variant
from analysis.labs.pd_disagg_plan import GRID
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Verdict

WORKLOADS = (*(name for name, _, _ in GRID), "prefix_miss", "prefix_hit")
KEYS = ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tok_s", "n", "failed")


def _json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def ratio(pd: float | None, base: float | None) -> float | None:
    """P/D's figure over the baseline's (None when either is missing or the baseline is 0)."""
    if pd is None or not base:
        return None
    return round(pd / base, 3)


def _transfers(rdir: Path, requests: int | None) -> dict[str, Any]:
    sides = {
        s: kv_transfer.side(
            prom.read(rdir / f"metrics_{s}_before.prom"), prom.read(rdir / f"metrics_{s}_after.prom")
        )
        for s in ("prefill", "decode")
    }
    return kv_transfer.summarise(sides["prefill"], sides["decode"], requests)


def _roles(plan: dict[str, Any]) -> tuple[str | None, str | None]:
    pd = next((v["name"] for v in plan["variants"] if v.get("pd")), None)
    base = next((v["name"] for v in plan["variants"] if not v.get("pd")), None)
    return base, pd


def figures(lab_dir: Path, plan: dict[str, Any], variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    base_name, pd_name = _roles(plan)
    rows: dict[str, Any] = {}
    for wl in WORKLOADS:
        row: dict[str, Any] = {}
        for role, name in (("baseline", base_name), ("pd", pd_name)):
            v = variants.get(name) if name else None
            run = v.runs.get(wl) if v else None
            st = run_stats(v, run) if (v is not None and run is not None and run.ok) else {}
            row[role] = {k: st.get(k) for k in KEYS} | {"status": run.status if run else "missing"}
            if run is not None:
                row.setdefault("workload", run.workload)
        row["ratio"] = {
            k: ratio(row["pd"].get(k), row["baseline"].get(k))
            for k in ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")
        }
        if pd_name:
            row["kv"] = _transfers(lab_dir / pd_name / "runs" / wl, row["pd"].get("n"))
        rows[wl] = row
    pd_dir = lab_dir / pd_name if pd_name else None
    launch = _json(pd_dir / "server" / "pd_launch.json") if pd_dir else None
    return {
        "baseline": base_name,
        "pd": pd_name,
        "workloads": rows,
        "break_even": break_even(rows),
        "launch": {
            k: (launch or {}).get(k) for k in ("engine", "measured_url", "through_router", "router", "check")
        }
        if isinstance(launch, dict)
        else None,
        "router_stats": _json(pd_dir / "router_stats.json") if pd_dir else None,
        "fault": fault(pd_dir) if pd_dir else None,
        "connector_log_failures": kv_transfer.log_failures(_text(pd_dir / "logs" / "connector.log"))
        if pd_dir
        else None,
    }


def fault(vdir: Path) -> dict[str, Any] | None:
    """What the requests of the fault run saw when the prefill instance was stopped mid-run: how many
    completed and failed, the error classes and the first distinct messages, and which of the trio still
    answered its health check afterwards. None when the lab ran no fault run."""
    rec = _json(vdir / "fault" / "fault.json")
    if not isinstance(rec, dict):
        return None
    bench = _json(vdir / "fault" / "bench.json")
    reqs = bench.get("requests", []) if isinstance(bench, dict) else []
    errors: list[str] = []
    for r in reqs:
        msg = str(r.get("error") or "").strip()[:200]
        if not r.get("success") and msg and msg not in errors and len(errors) < 3:
            errors.append(msg)
    try:
        stopped = round(float(rec["prefill_stopped_at"]) - float(rec["started_at"]), 2)
    except (KeyError, TypeError, ValueError):
        stopped = None
    return rec | {
        "stopped_within_s": stopped,
        "client_result": isinstance(bench, dict),
        "requests": len(reqs),
        "completed": sum(1 for r in reqs if r.get("success")),
        "failed": sum(1 for r in reqs if not r.get("success")),
        "errors_by_class": (bench or {}).get("errors_by_class", {}) if isinstance(bench, dict) else {},
        "first_errors": errors,
    }


def _fault_line(f: dict[str, Any]) -> str:
    if not f["client_result"]:
        return (
            f"fault run: prefill stopped {f['after_s']} s into the run; the client wrote no result "
            f"(exit code {f['client_rc']}); router answering afterwards: {f['router_health_after']}"
        )
    return (
        f"fault run: prefill stopped {f['after_s']}-{f['stopped_within_s']} s into the run: "
        f"{f['completed']} of {f['requests']} requests completed, {f['failed']} failed "
        f"({f['errors_by_class'] or 'no error class'}; first: "
        f"{' | '.join(f['first_errors']) or '-'}); afterwards prefill answering {f['prefill_health_after']}, "
        f"decode {f['decode_health_after']}, router {f['router_health_after']}"
    )


def break_even(rows: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per figure, the workloads where P/D is better and those where the baseline is (lower TTFT / TPOT,
    higher throughput); a workload missing a figure is in neither."""
    out: dict[str, dict[str, list[str]]] = {}
    for key, lower in (("ttft_p50_ms", True), ("tpot_p50_ms", True), ("output_tok_s", False)):
        wins: dict[str, list[str]] = {"pd": [], "baseline": []}
        for wl, row in rows.items():
            r = row["ratio"].get(key)
            if r is None:
                continue
            pd_better = r < 1.0 if lower else r > 1.0
            wins["pd" if pd_better else "baseline"].append(wl)
        out[key] = wins
    return out


def _problems(fig: dict[str, Any]) -> list[str]:
    out = []
    launch = fig.get("launch")
    if not launch or launch.get("through_router") is not True:
        out.append(
            "no launch record saying the P/D variant was measured through the router (not a P/D result)"
        )
    for wl, row in fig["workloads"].items():
        kv = row.get("kv") or {}
        n = row["pd"].get("n")
        if n and kv.get("transfers") is None and kv.get("last_latency_ms") is None:
            out.append(f"{wl}: no KV transfer figure on either side's /metrics")
        elif n and kv.get("transfers") is not None and kv["transfers"] < n:
            out.append(f"{wl}: {kv['transfers']:.0f} KV transfers for {n} requests")
    return out


def _line(wl: str, row: dict[str, Any]) -> str:
    b, p, r, kv = row["baseline"], row["pd"], row["ratio"], row.get("kv") or {}
    w = row.get("workload") or {}
    return (
        f"{wl} ({w.get('isl')} in / {w.get('osl')} out, {w.get('num_prompts')} requests at concurrency "
        f"{w.get('concurrency')}): TTFT p50 {b['ttft_p50_ms']} -> {p['ttft_p50_ms']} ms "
        f"(x{r['ttft_p50_ms']}), "
        f"TPOT p50 {b['tpot_p50_ms']} -> {p['tpot_p50_ms']} ms (x{r['tpot_p50_ms']}), output "
        f"{b['output_tok_s']} -> {p['output_tok_s']} tok/s (x{r['output_tok_s']}) baseline -> P/D; "
        f"KV transfers {kv.get('transfers')}, failures {kv.get('failures')}, "
        f"{kv.get('mb_per_transfer')} MB and {kv.get('ms_per_transfer')} ms per transfer"
    )


def judge(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    """Supported when P/D lowers TPOT p50 (beyond the margin) on at least one workload, measured through
    the router with every request's KV transferred; not supported when it lowers it on none. The
    break-even (where P/D wins TTFT, TPOT, throughput) is reported either way."""
    margin = float(th.get("margin", 0.1))
    obs = [_line(name, row) for name, row in fig["workloads"].items() if row["pd"].get("n")]
    be = fig["break_even"]
    obs.append(
        "break-even: P/D better on "
        + "; ".join(f"{k}: {', '.join(v['pd']) or 'none'}" for k, v in be.items())
    )
    if fig.get("fault"):
        obs.append(_fault_line(fig["fault"]))
    comparisons = []
    for c in comps:
        for name, row in fig["workloads"].items():
            r = row["ratio"].get("tpot_p50_ms")
            verdict = INCONCLUSIVE if r is None else (SUPPORTED if r < 1 - margin else NOT_SUPPORTED)
            comparisons.append(
                {
                    "baseline": c["baseline"],
                    "treatment": c["treatment"],
                    "variable": c["variable"],
                    "workload": name,
                    "figure": "TPOT p50 (ms)",
                    "baseline_value": row["baseline"].get("tpot_p50_ms"),
                    "treatment_value": row["pd"].get("tpot_p50_ms"),
                    "verdict": verdict,
                    "reason": "",
                }
            )
    problems = _problems(fig)
    if problems:
        return Verdict(INCONCLUSIVE, "; ".join(problems), obs, comparisons)
    wins = [c["workload"] for c in comparisons if c["verdict"] == SUPPORTED]
    if not any(c["verdict"] != INCONCLUSIVE for c in comparisons):
        return Verdict(INCONCLUSIVE, "no workload has TPOT for both variants", obs, comparisons)
    if wins:
        return Verdict(
            SUPPORTED,
            f"P/D lowers TPOT p50 by more than {margin:.0%} on {', '.join(wins)} (through the router, every "
            "request's KV transferred); TTFT and throughput per workload in the observations",
            obs,
            comparisons,
        )
    return Verdict(
        NOT_SUPPORTED,
        f"P/D lowers TPOT p50 by more than {margin:.0%} on no workload against one instance on the same GPUs",
        obs,
        comparisons,
    )


def pitfalls(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    out = [
        "the baseline is one instance whose TP size is the P/D pair's GPU count: TP spreads every phase over "
        "all GPUs, P/D gives each phase its own; a DP baseline would answer a different question",
        "SGLang exports only the last KV transfer's size and latency (gauges), so its per-transfer time is "
        "one sample, not a mean; vLLM's NIXL histograms and enginesim's counters give the mean",
    ]
    kv_miss = [n for n, r in fig["workloads"].items() if (r.get("kv") or {}).get("failures")]
    if kv_miss:
        out.append(f"KV transfer failures during {', '.join(kv_miss)}: those requests' figures are missing")
    if fig.get("connector_log_failures"):
        out.append(f"the connector logged {fig['connector_log_failures']} transfer/bootstrap failures")
    hit = fig["workloads"].get("prefix_hit", {})
    if hit.get("pd", {}).get("n"):
        out.append(
            "prefix hit through the router: the prefix cache that is hit is the prefill instance's; the "
            "decode instance receives the whole KV either way: a hit saves prefill time, not transfer bytes"
        )
    return out
