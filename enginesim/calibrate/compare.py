"""Side by side: measured whole-step times against enginesim's cost model under two hardware profiles.

Why: a measured profile is only worth loading if it moves the cost model's step times toward what the
GPU did. Standard library only (no torch): it reads raw.json files and prices the same steps.

    python -m enginesim.calibrate.compare --profile enginesim/data/measured/h200/profile.json \
        enginesim/data/measured/h200/raw.json enginesim/data/measured/h200/llama8b-raw.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .. import catalog, hwprofile
from ..costmodel import CostModel

# The scheduler's CPU costs are an engine's (data/engines.json), not the GPU's: the measurement has no
# engine around it. The "with sched. CPU" columns add SGLang's.
ENGINE = "sglang"


def price(
    model: catalog.ModelSpec,
    hw: catalog.Hardware,
    row: dict[str, Any],
    engine: dict[str, float] | None = None,
) -> float:
    """Seconds the cost model gives the measured step `row` (tp 1, bf16 KV)."""
    decode = "batch" in row and "prompt_tokens" not in row
    cm = CostModel(
        model,
        hw,
        tp=1,
        ep=1,
        nnodes=1,
        kv_bytes_per_token=model.kv_bytes_per_token(2, 1),
        cuda_graph=bool(row.get("cuda_graph")) and decode,
        graph_max_bs=max(256, row.get("batch", 1)),
        graph_covers_mixed=False,
        engine=engine,
    )
    if decode:
        b = row["batch"]
        return cm.step([], b, b, b * row["context_per_request"]).total
    return cm.step([(row["prompt_tokens"], 0)], 0, 0, 0).total


def rows_of(raw: dict[str, Any]) -> list[dict[str, Any]]:
    model = raw.get("sections", {}).get("model") or {}
    out = [r for r in (model.get("decode") or {}).get("rows", []) if "median_s" in r]
    return out + [r for r in model.get("prefill") or [] if "median_s" in r]


def table(
    raws: list[dict[str, Any]], profile_doc: dict[str, Any], stock: str = "h200"
) -> list[dict[str, Any]]:
    """One record per measured step: its measured medians and four predictions (stock or measured
    profile, each with and without the scheduler's CPU cost)."""
    prof = hwprofile.validate(profile_doc)
    eng = catalog.load_engine_costs(ENGINE)
    stock_hw, prof_hw = catalog.load_hardware(stock), catalog.load_hardware("custom", prof)
    hws = {
        "stock": (stock_hw, eng),
        "stock_gpu": (stock_hw, None),
        "profile": (prof_hw, eng),
        "profile_gpu": (prof_hw, None),
    }
    out = []
    for raw in raws:
        name = raw["plan"]["model"]["model"]
        if raw["plan"]["model"].get("shrunk"):
            raise ValueError(f"raw result for {name} was measured on shrunk (CPU) shapes: nothing to compare")
        spec = catalog.load_model(name)
        for r in rows_of(raw):
            rec = {
                "model": name,
                "step": (
                    f"decode B={r['batch']} ctx={r['context_per_request']}"
                    if "prompt_tokens" not in r
                    else f"prefill {r['prompt_tokens']}"
                ),
                "cuda_graph": bool(r.get("cuda_graph")),
                "measured_s": r["median_s"],
                "measured_wall_s": (r.get("wall_synced") or {}).get("median_s"),
            }
            for k, (hw, engine) in hws.items():
                rec[k + "_s"] = price(spec, hw, r, engine)
            out.append(rec)
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    head = (
        "| model | step | graph | measured (device) | measured (host, synced) | stock h200 | stock h200, no "
        "sched. CPU | measured profile | measured profile, no sched. CPU | stock / measured | measured "
        "profile / measured |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in records:
        ms = r["measured_s"]

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.3f} ms"

        lines.append(
            f"| {r['model'].split('/')[-1]} | {r['step']} | {'yes' if r['cuda_graph'] else 'no'} | {f(ms)} | "
            f"{f(r['measured_wall_s'])} | {f(r['stock_s'])} | {f(r['stock_gpu_s'])} | {f(r['profile_s'])} | "
            f"{f(r['profile_gpu_s'])} | {r['stock_gpu_s'] / ms:.2f} | {r['profile_gpu_s'] / ms:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enginesim.calibrate.compare", description=__doc__)
    p.add_argument("--profile", required=True, help="profile.json written by python -m enginesim.calibrate")
    p.add_argument("--stock", default="h200", help="hardware.json profile to compare with (default h200)")
    p.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")
    p.add_argument("raw", nargs="+", help="raw.json files with a model section")
    ns = p.parse_args(argv)
    if ns.stock not in catalog.hardware_keys():
        p.error(f"--stock {ns.stock!r}: must be one of {', '.join(catalog.hardware_keys())}")
    try:
        with open(ns.profile, encoding="utf-8") as f:
            doc = json.load(f)
        raws = []
        for path in ns.raw:
            with open(path, encoding="utf-8") as f:
                raws.append(json.load(f))
        records = table(raws, doc, ns.stock)
    except (OSError, ValueError, KeyError) as e:
        print(f"python -m enginesim.calibrate.compare: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(records, indent=1) if ns.json else markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
