"""quant_matrix: figures, verdict and pitfalls of the weight-format comparison.

Why its own module: the verdict of a format comparison rests first on the kernel evidence (did the
variant run the format it asked for?) and only then on time; a fallback or an unproven kernel makes
that comparison "not comparable" (inconclusive) whatever its numbers say, so a slower path never
passes as the requested format. Accuracy is read from lm_eval's results, never invented: on an
emulated engine it is "not measured (emulated engine)".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from analysis.evidence import quant as qev
from analysis.evidence import startup
from analysis.labs.figures import run_stats
from analysis.labs.load import Variant
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, Verdict, direction

EMULATED_ACCURACY = "not measured (emulated engine)"
FP8_NATIVE_MIN_SM = 89
# GPU name (nvidia-smi, or enginesim's hardware key) -> compute capability, most specific first.
_SM = (
    ("gb200", 100),
    ("b200", 100),
    ("rtx pro 6000", 120),
    ("rtx-pro-6000", 120),
    ("h200", 90),
    ("h100", 90),
    ("h800", 90),
    ("h20", 90),
    ("l40s", 89),
    ("l40", 89),
    ("l4", 89),
    ("4090", 89),
    ("a100", 80),
    ("a800", 80),
    ("a40", 86),
    ("a10", 86),
    ("3090", 86),
    ("t4", 75),
    ("v100", 70),
)
PRIMARY = "random_c1"  # batch 1: decode reads every weight once per token


def capability(gpu_name: str | None) -> int | None:
    if not gpu_name:
        return None
    low = gpu_name.lower()
    return next((sm for needle, sm in _SM if needle in low), None)


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def accuracy(vdir: Path, emulated: bool) -> dict[str, Any]:
    """lm_eval's scores for the variant, or why there are none (the hook's own status file)."""
    if emulated:
        return {"status": EMULATED_ACCURACY, "scores": {}}
    status = _read_json(vdir / "accuracy" / "status.json") or {}
    results = sorted((vdir / "accuracy").glob("**/results*.json")) if (vdir / "accuracy").is_dir() else []
    scores: dict[str, Any] = {}
    for path in results:
        scores.update(qev.lm_eval_scores(_read_json(path)))
    if scores:
        return {"status": "measured (lm_eval)", "scores": scores, "files": [p.name for p in results]}
    return {"status": status.get("status", "not measured (no lm_eval results)"), "scores": {}}


def _platform(v: Variant, mem: list[dict[str, Any]]) -> dict[str, Any]:
    gpu = None
    source = None
    if v.emulator is not None:
        gpu, source = str(v.emulator.get("hardware") or ""), "enginesim hardware profile"
    elif mem:
        gpu, source = mem[0]["name"], "nvidia-smi"
    elif v.gpus:
        gpu, source = v.gpus.splitlines()[0].split(",")[0], "nvidia-smi"
    sm = capability(gpu)
    return {
        "gpu": gpu,
        "source": source,
        "compute_capability": sm,
        "fp8_native": None if sm is None else sm >= FP8_NATIVE_MIN_SM,
    }


def variant_figures(lab_dir: Path, spec: dict[str, Any], v: Variant, engine: str) -> dict[str, Any]:
    requested = _flag(v.args, "--quantization")
    ev = qev.kernel_evidence(v.server_log)
    served = qev.served_format(requested, spec["name"], ev)
    vdir = lab_dir / spec["name"]
    mem_csv = vdir / "gpu_memory.csv"
    mem = qev.gpu_memory(mem_csv.read_text()) if mem_csv.is_file() else []
    platform = _platform(v, mem)
    comparable, why = True, ""
    if served["status"] not in ("as requested", "as requested (slow kernel)"):
        comparable, why = False, f"{served['status']}: {served['why']}"
    elif "fp8" in (requested or spec["name"]) and platform["fp8_native"] is False:
        comparable, why = (
            False,
            f"FP8 needs native FP8 (sm_89+); {platform['gpu']} is sm_{platform['compute_capability']}",
        )
    elif "fp8" in (requested or spec["name"]) and platform["fp8_native"] is None:
        comparable, why = False, "FP8 support of this GPU is unknown (no GPU name recorded)"
    cap = startup.capacity(v.server_log, engine)
    runs = {}
    for name, run in v.runs.items():
        st = run_stats(v, run)
        runs[name] = {
            "dataset": run.workload.get("dataset"),
            "concurrency": run.workload.get("concurrency"),
            "n": st["n"],
            "output_tok_s": st["output_tok_s"],
            "ttft_p99_ms": st["ttft_p99_ms"],
            "tpot_p99_ms": st["tpot_p99_ms"],
            "tpot_p50_ms": st["tpot_p50_ms"],
        }
    return {
        "model": spec.get("model"),
        "requested_quantization": requested or "none (checkpoint dtype)",
        "kv_cache_dtype": _flag(v.args, "--kv-cache-dtype") or "auto (not passed)",
        "kernel": ev.as_dict(),
        "served": served,
        "platform": platform,
        "comparable": comparable,
        "not_comparable_why": why,
        "memory": {
            "weights_gib_from_log": ev.weight_gib,
            "kv_capacity_tokens": cap.tokens if cap else None,
            "nvidia_smi": mem or "not measured (no nvidia-smi on the head)",
        },
        "runs": runs,
        "accuracy": accuracy(vdir, v.emulated),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(b / a, 3) if a and b is not None else None


def figures(lab_dir: Path, plan: dict[str, Any], variants: dict[str, Variant], engine: str) -> dict[str, Any]:
    specs = {s["name"]: s for s in plan["variants"]}
    out = {name: variant_figures(lab_dir, specs[name], v, engine) for name, v in variants.items()}
    split = {}
    for c in plan.get("comparisons", []):
        a, b = out.get(c["baseline"]), out.get(c["treatment"])
        if a is None or b is None:
            continue

        def run(fig: dict[str, Any], rn: str, key: str) -> float | None:
            return (fig["runs"].get(rn) or {}).get(key)

        split[c["treatment"]] = {
            "tpot_p99_c1_ratio": _ratio(
                run(a, "random_c1", "tpot_p99_ms"), run(b, "random_c1", "tpot_p99_ms")
            ),
            "output_tok_s_sat_ratio": _ratio(
                run(a, "random_sat", "output_tok_s"), run(b, "random_sat", "output_tok_s")
            ),
            "sharegpt_output_tok_s_sat_ratio": _ratio(
                run(a, "sharegpt_sat", "output_tok_s"), run(b, "sharegpt_sat", "output_tok_s")
            ),
            "weights_gib_ratio": _ratio(
                a["memory"]["weights_gib_from_log"], b["memory"]["weights_gib_from_log"]
            ),
            "kv_capacity_ratio": _ratio(a["memory"]["kv_capacity_tokens"], b["memory"]["kv_capacity_tokens"]),
            "kernel": b["kernel"]["kernel"],
        }
    return {"variants": out, "split": split, "primary_run": PRIMARY}


def judge(
    fig: dict[str, Any], comps: list[dict[str, Any]], wl: dict[str, Any], th: dict[str, Any]
) -> Verdict:
    """Each format vs the baseline on TPOT p99 at batch 1, only where both ran what they asked for."""
    margin = float(th.get("margin", 0.1))
    vs = fig["variants"]
    obs, out = [], []
    for name, v in vs.items():
        c1 = v["runs"].get(PRIMARY) or {}
        sat = v["runs"].get("random_sat") or {}
        obs.append(
            f"{name}: served {v['served']['status']} ({v['kernel']['kernel'] or 'no kernel named'}), weights "
            f"{v['memory']['weights_gib_from_log']} GiB (start-up log), TPOT p99 "
            f"{c1.get('tpot_p99_ms')} ms at C=1, output {sat.get('output_tok_s')} tok/s at "
            f"C={sat.get('concurrency')} "
            f"(random {wl.get('isl')}/{wl.get('osl')}); accuracy: {v['accuracy']['status']}"
        )
    for c in comps:
        a, b = vs.get(c["baseline"]), vs.get(c["treatment"])
        row = {"baseline": c["baseline"], "treatment": c["treatment"], "variable": c.get("variable")}
        if a is None or b is None:
            out.append(row | {"verdict": INCONCLUSIVE, "reason": "variant missing"})
            continue
        blocked = [
            f"{n}: {f['not_comparable_why']}"
            for n, f in ((c["baseline"], a), (c["treatment"], b))
            if not f["comparable"]
        ]
        if blocked:
            out.append(
                row
                | {
                    "verdict": INCONCLUSIVE,
                    "reason": "not comparable: "
                    + "; ".join(blocked)
                    + " (its figures are not the requested format's)",
                }
            )
            continue
        x = (a["runs"].get(PRIMARY) or {}).get("tpot_p99_ms")
        y = (b["runs"].get(PRIMARY) or {}).get("tpot_p99_ms")
        d = direction(x, y, margin)
        expect = c.get("expect", "lower")
        if d is None:
            verdict, why = INCONCLUSIVE, "TPOT p99 at C=1 missing"
        elif d == expect:
            verdict, why = (
                SUPPORTED,
                f"TPOT p99 at C=1 {d}: {y} ms vs {x} ms ({y / x:.2f}x); {b['served']['why']}",
            )
        else:
            verdict, why = NOT_SUPPORTED, f"TPOT p99 at C=1 {d} ({y} ms vs {x} ms); expected {expect}"
        out.append(
            row
            | {"baseline_value": x, "treatment_value": y, "direction": d, "verdict": verdict, "reason": why}
        )
    if not out:
        return Verdict(INCONCLUSIVE, "nothing to compare", obs, out)
    for level in (INCONCLUSIVE, NOT_SUPPORTED):
        bad = [f"{r['baseline']} vs {r['treatment']}: {r['reason']}" for r in out if r["verdict"] == level]
        if bad:
            return Verdict(level, "; ".join(bad), obs, out)
    return Verdict(SUPPORTED, "; ".join(f"{r['treatment']}: {r['reason']}" for r in out), obs, out)


def pitfalls(fig: dict[str, Any], wl: dict[str, Any]) -> list[str]:
    out = []
    for name, v in fig["variants"].items():
        k = v["kernel"]
        if k["fallback"]:
            out.append(
                f"{name}: FALLBACK in its start-up log: {k['fallback']}; its figures are not "
                f"{v['requested_quantization']}"
            )
        if k["slow_path"]:
            out.append(f"{name}: slow kernel path: {k['slow_path']}")
        for e in k["errors"]:
            out.append(f"{name}: start-up refused the format: {e!r}")
        if v["memory"]["weights_gib_from_log"] is None:
            out.append(f"{name}: no weight-memory line in its start-up log")
        if isinstance(v["memory"]["nvidia_smi"], str):
            out.append(
                f"{name}: GPU memory {v['memory']['nvidia_smi']}; weights from the engine's own line only"
            )
    if not wl.get("sharegpt_path"):
        out.append(
            "the ShareGPT-shaped runs use generated prompts with log-normal lengths, not a real ShareGPT file"
        )
    out.append(
        "weight dtype and KV-cache dtype are separate variables: every variant here keeps the same KV dtype"
    )
    return out
