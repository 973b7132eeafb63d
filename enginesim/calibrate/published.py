"""Published serving figures against enginesim's replay of the same workload (issue 16 item 1).

Why: the engine profiles' fixed costs (data/engines.json) are fitted to public measurements, and the
only honest check of a fit is to replay every row, fitted or held out, through the very replay path a
user runs (`python -m enginesim replay ...`) and print the error of each. The README's table is this
module's output; a test re-renders it and fails when the two differ, so the table cannot drift from
the code.

    python -m enginesim.calibrate.published table           # the README table (markdown)
    python -m enginesim.calibrate.published check enginesim/README.md
    python -m enginesim.calibrate.published fit             # refit the engine costs (prints JSON)
    python -m enginesim.calibrate.published fit-hardware    # refit kernel floor / launch (H200 raw)

Standard library only, like the rest of enginesim.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

from .. import catalog, replay
from ..costmodel import CostModel

BEGIN = "<!-- published-table:begin (python -m enginesim.calibrate.published table) -->"
END = "<!-- published-table:end -->"
TOLERANCE = 0.25  # the goal: every row within +-25 %


def load_rows() -> list[dict[str, Any]]:
    text = resources.files("enginesim").joinpath("data", "public_measurements.json").read_text()
    return json.loads(text)["rows"]


def replay_argv(row: dict[str, Any]) -> list[str]:
    """The `python -m enginesim replay` arguments of a row: the engine's command line plus the workload."""
    rp = row["replay"]
    w = rp["workload"]
    argv = [
        *rp["argv"],
        "--isl",
        str(w["isl"]),
        "--osl",
        str(w["osl"]),
        "--num-prompts",
        str(w["num_prompts"]),
    ]
    if w.get("concurrency"):
        argv += ["--concurrency", str(w["concurrency"])]
    if w.get("request_rate"):
        argv += ["--request-rate", str(w["request_rate"])]
    # the public benchmark clients send text, which the engine tokenises (loadgen sends token ids)
    argv += ["--prompt-format", w.get("prompt_format", "text")]
    return argv


def run_row(row: dict[str, Any], engine: dict[str, float] | None = None) -> dict[str, Any]:
    """The replay's loadgen-style result for a row (optionally under other engine costs, for fitting)."""
    cfg, w = replay.parse(replay_argv(row))
    if engine is None:
        return replay.run(cfg, w)
    saved = catalog.load_engine_costs
    catalog.load_engine_costs = lambda _flavour: dict(engine)  # type: ignore[assignment]
    try:
        return replay.run(cfg, w)
    finally:
        catalog.load_engine_costs = saved  # type: ignore[assignment]


def replayable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("replay")]


def figure_value(cmp: dict[str, Any], res: dict[str, Any], results: dict[str, dict[str, Any]]) -> float:
    """One compared figure from a replay result (a ratio names the other row it divides by)."""
    if "ratio_to" in cmp:
        other = results[cmp["ratio_to"]]
        return res[cmp["replay_key"]] / other[cmp["replay_key"]]
    return float(res[cmp["replay_key"]])


def compare_all(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per compared figure of every replayable row: published, replayed, error, role."""
    results = {r["id"]: run_row(r) for r in replayable(rows)}
    out = []
    for r in replayable(rows):
        for cmp in r["compare"]:
            got = figure_value(cmp, results[r["id"]], results)
            out.append(
                {
                    "row": r,
                    "figure": cmp["figure"],
                    "published": cmp["published"],
                    "replay": got,
                    "error": got / cmp["published"] - 1.0,
                    "role": cmp["role"],
                }
            )
    return out


def _fmt(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def markdown(records: list[dict[str, Any]]) -> str:
    """The README table: one line per compared figure."""
    lines = [
        BEGIN,
        "| engine | version | GPU | model | workload | figure | published | enginesim replay | error | "
        "fit / held out | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        r = rec["row"]
        err = rec["error"]
        miss = "" if abs(err) <= TOLERANCE else " **miss**"
        lines.append(
            f"| {r['engine']} | {r['engine_version']} | {r['gpu']} | {r['model'].split('/')[-1]} | "
            f"{r['workload_text']} | {rec['figure']} | {_fmt(rec['published'])} | {_fmt(rec['replay'])} | "
            f"{err * 100:+.0f} %{miss} | {rec['role']} | [{r['source_label']}]({r['source_url']}) "
            f"({r['source_locator']}) |"
        )
    lines.append(END)
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The committed table between the markers of a README (empty when the markers are missing)."""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN) : text.index(END) + len(END)]


# ---- fitting ----------------------------------------------------------------------------------------
def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, steps: int = 16) -> float:
    """x in [lo, hi] with f(x) = target, f increasing."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _compared(rows: list[dict[str, Any]], row_id: str, figure: str) -> tuple[dict[str, Any], dict[str, Any]]:
    row = next(r for r in rows if r["id"] == row_id)
    return row, next(c for c in row["compare"] if c["figure"] == figure)


def fit_engine(flavour: str, rows: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Fit one engine's costs to the figures its profile names in `fitted_on`.

    step_cpu from one decode figure (TPOT at concurrency 1: a step there is GPU + step_cpu); then
    intake from one TTFT figure, the profile's intake_per_token standing (tokenisation, a measured
    rate, not a fit: a fit would push prefill work that prefix caching saves into intake); a profile
    that names two TTFT figures of different prompt lengths fits both, linear in the two.
    per_request_cpu and sampling are not fitted (no row can separate them from step_cpu).
    """
    rows = rows or load_rows()
    prof = json.loads(resources.files("enginesim").joinpath("data", "engines.json").read_text())["engines"][
        flavour
    ]
    costs = {k: float(v) for k, v in prof["costs_s"].items()}
    fits = prof["fitted_on"]
    tpot = [f for f in fits if f["param"] == "step_cpu"]
    for f in tpot:
        row, cmp = _compared(rows, f["row"], f["figure"])

        def tpot_of(x: float, row: dict[str, Any] = row, cmp: dict[str, Any] = cmp) -> float:
            return float(run_row(row, {**costs, "step_cpu": x})[cmp["replay_key"]])

        costs["step_cpu"] = _bisect(tpot_of, cmp["published"], 0.0, 0.02)
    ttft = [f for f in fits if f["param"] in ("intake", "intake_per_token")]
    if ttft:
        pts = []
        for f in ttft:
            row, cmp = _compared(rows, f["row"], f["figure"])
            # intake_per_token is fitted only when a profile names it; otherwise its value stands
            zero_per_token = any(f["param"] == "intake_per_token" for f in ttft)
            base = {**costs, "intake": 0.0, **({"intake_per_token": 0.0} if zero_per_token else {})}
            t0 = float(run_row(row, base)[cmp["replay_key"]])
            pts.append((row["replay"]["workload"]["isl"], cmp["published"] - t0))
        if len(pts) == 1:
            costs["intake"] = max(pts[0][1], 0.0) / 1e3
        else:
            (n1, r1), (n2, r2) = pts[0], pts[-1]
            slope = (r2 - r1) / (n2 - n1)
            costs["intake_per_token"] = max(slope, 0.0) / 1e3
            costs["intake"] = max(r1 - n1 * max(slope, 0.0), 0.0) / 1e3
    return costs


def fit_hardware(raws: list[dict[str, Any]]) -> dict[str, float]:
    """kernel_floor and kernel_launch from whole-step measurements (calibrate's raw.json model section).

    kernel_floor: median over graph-replayed decode steps at batch <= 64 of (measured - roofline -
    graph replay) / kernels; kernel_launch: median over eager decode steps of measured / kernels (a
    launch-bound step: the host issues kernels more slowly than the GPU runs them).
    """
    from .compare import rows_of

    hw = catalog.load_hardware("h200")
    ov = hw.overheads
    hw.overheads = {**ov, "kernel_floor": 0.0}
    floors, launches = [], []
    for raw in raws:
        model = catalog.load_model(raw["plan"]["model"]["model"])
        kernels = model.layers * ov["kernels_per_layer"]
        for r in rows_of(raw):
            if "prompt_tokens" in r:
                continue
            b = r["batch"]
            cm = CostModel(model, hw, 1, 1, 1, model.kv_bytes_per_token(2, 1), True, 256, False)
            c = cm.step([], b, b, b * r["context_per_request"])
            if r.get("cuda_graph") and b <= 64:
                floors.append((r["median_s"] - max(c.compute, c.memory) - ov["graph_replay"]) / kernels)
            elif not r.get("cuda_graph"):
                launches.append(r["median_s"] / kernels)
    return {"kernel_floor": statistics.median(floors), "kernel_launch": statistics.median(launches)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enginesim.calibrate.published", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("table", help="print the README table")
    ck = sub.add_parser("check", help="exit 1 when the README's table differs from a fresh replay")
    ck.add_argument("readme")
    ft = sub.add_parser("fit", help="refit the engine costs to their fitted_on rows (prints JSON)")
    ft.add_argument("--engine", choices=("sglang", "vllm"), action="append")
    fh = sub.add_parser("fit-hardware", help="refit kernel_floor and kernel_launch from raw.json files")
    fh.add_argument(
        "raw",
        nargs="*",
        default=["enginesim/data/measured/h200/raw.json", "enginesim/data/measured/h200/llama8b-raw.json"],
    )
    ns = p.parse_args(argv)
    if ns.cmd == "table":
        print(markdown(compare_all(load_rows())))
    elif ns.cmd == "check":
        with open(ns.readme, encoding="utf-8") as f:
            committed = readme_table(f.read())
        fresh = markdown(compare_all(load_rows()))
        if committed != fresh:
            print(
                f"{ns.readme}: the published-figures table differs from the replay; regenerate it with "
                "`python -m enginesim.calibrate.published table`",
                file=sys.stderr,
            )
            return 1
    elif ns.cmd == "fit":
        print(json.dumps({e: fit_engine(e) for e in ns.engine or ("sglang", "vllm")}, indent=1))
    else:
        raws = []
        for path in ns.raw:
            with open(path, encoding="utf-8") as f:
                raws.append(json.load(f))
        print(json.dumps(fit_hardware(raws), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
