"""report.md: every latency figure with its workload (ISL, OSL, concurrency, requests, reps)
and its statistic, plus statuses, the A/B table, the metric definitions and the plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from analysis import clients

DEFINITIONS = """\
- **TTFT** = first content-bearing event − request send. **E2E** = last content event − send.
- **TPOT** per request = (E2E − TTFT)/(output_tokens − 1); statistics are over the per-request values.
- **ITL** = gap between content events, split evenly over the tokens of an event (per-token ITL);
  SGLang's `itls` and loadgen's `itls` are per-token, vLLM's are per streamed chunk.
- Percentiles: numpy linear interpolation; std is the population std over requests (as SGLang).
- Figures come from the client's own summary when it wrote them, otherwise they are recomputed
  from its per-request arrays (`*_source` columns in summary.csv say which).
- Across repetitions: mean, sample std, CV = std/mean, bootstrap 95% CI of the mean (2000 seeded
  resamples; needs >= 2 reps, otherwise "n/a").
- A/B: change = (background − control)/control. CI: bootstrap over requests (latency p95) or over
  repetitions (throughput). "Outside noise" = Mann-Whitney U p < 0.05 on request-level samples
  **and** a CI that excludes 0; throughput needs >= 2 reps for a CI.
- Token counts come from the server's usage when present, else the client's count."""


def _n(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        if 0 < abs(v) < 1:  # sub-millisecond latencies (an emulator, a fast GPU): keep 3 figures
            return f"{v:.3g}"
        return f"{v:,.{digits}f}"
    return str(v)


def _ci(a: dict[str, Any] | None, digits: int = 1) -> str:
    if not a:
        return "n/a"
    txt = _n(a["mean"], digits)
    if math.isfinite(a["ci95_low"]) and math.isfinite(a["ci95_high"]):
        txt += f" [{_n(a['ci95_low'], digits)}, {_n(a['ci95_high'], digits)}]"
    return txt


def _name(r: dict[str, Any]) -> str:
    return f"{r['case_id']}/{r['role']}" if r["role"] and r["role"] not in r["case_id"] else r["case_id"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
    return out


def _emulation_note(manifest: dict[str, Any]) -> list[str]:
    """An emulated run must never pass for a GPU measurement: say so, with its time scale."""
    env = manifest.get("engine_env")
    if not isinstance(env, dict) or not any(str(k).startswith("ENGINESIM_") for k in env):
        return []
    scale = env.get("ENGINESIM_TIME_SCALE", "1.0")
    return [
        f"- **emulated engine (enginesim), time scale {scale}**: every latency and throughput here is "
        f"the emulated hardware's figure times {scale} (throughput divided by it), not a GPU measurement"
    ]


def _engine(manifest: dict[str, Any]) -> str | None:
    """Which engine served the run (sglang | vllm), how it ran, and the command its flags follow: the
    flags line alone does not say whether they went to SGLang or vLLM."""
    engine = manifest.get("engine")
    if not engine:
        return None
    txt = f"{engine} ({manifest.get('engine_runtime') or 'unknown'} runtime)"
    cmd = manifest.get("engine_command")
    return f"{txt}, command `{cmd}`" if cmd else txt


def render(
    run_dir: Path,
    manifest: dict[str, Any],
    rows: list[dict[str, Any]],
    agg: list[dict[str, Any]],
    ab: list[dict[str, Any]],
    ab_info: dict[str, Any],
    plots: list[str],
    unreadable: list[tuple[str, str]] | None = None,
) -> str:
    L: list[str] = [f"# quickmap report: run `{manifest.get('run_id') or run_dir.name}`", ""]
    git = manifest.get("git") or {}
    tv = manifest.get("tool_versions") or {}
    info = [
        ("model", manifest.get("model")),
        ("engine", _engine(manifest)),
        (
            "engine image",
            tv.get("engine_image")
            or manifest.get("engine_image")
            or (f"none ({manifest['engine_runtime']} runtime)" if manifest.get("engine_runtime") else None),
        ),
        ("run status", manifest.get("status")),
        ("started / ended", f"{manifest.get('started_at', 'n/a')} / {manifest.get('ended_at', 'n/a')}"),
        ("git commit", f"{git.get('commit')} (dirty: {git.get('dirty')})" if git else None),
        (
            "python / ansible-core / quickmap",
            f"{tv.get('python')} / {tv.get('ansible_core')} / {tv.get('quickmap')}",
        ),
    ]
    if not tv:
        info.pop()
    flags = manifest.get("engine_flags")
    info.insert(3, ("engine flags", f"`{flags}`" if flags else None))
    nccl = manifest.get("nccl_env")
    if isinstance(nccl, dict) and nccl:
        info.insert(4, ("NCCL env", ", ".join(f"`{k}={v}`" for k, v in sorted(nccl.items()))))
    if not manifest:
        L.append("_No manifest.json in this run directory: provenance unknown._")
    L += [f"- {k}: {v}" for k, v in info if v is not None]
    L += _emulation_note(manifest)
    reasons = manifest.get("abort_reasons")
    if isinstance(reasons, list) and reasons:
        L.append("- **run stopped early**: " + "; ".join(map(str, reasons)))
    L.append("")
    if not rows:
        L += [
            "**No case ran**: the run directory holds no `cases/<case>/rep<N>/` or `mixed/rep<N>/<role>/`.",
            "",
        ]

    # ---- status
    L.append("## Status")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    L.append(
        ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        + f" (of {len(rows)} repetition directories)"
    )
    L.append("")
    if unreadable:
        L.append(f"**{len(unreadable)} result file(s) could not be read** (not summarised; exit status 3):")
        L += [f"- `{path}`: {why}" for path, why in unreadable]
        L.append("")
    unknown = [r for r in rows if r["status"] == "unknown"]
    if unknown:
        L.append(
            f"**{len(unknown)} result file(s) have no meta.json** (written by a client quickmap did not "
            "drive, e.g. SGLang's or vLLM's own benchmark): their status is **unknown**. They are "
            "summarised and aggregated (counted in `n_unknown`) but were not "
            "checked against a planned request count."
        )
        L += [f"- `{r['bench_file']}` ({r['source_format']})" for r in unknown]
        L.append("")
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        L.append("Failed repetitions (never counted as results):")
        for r in failed:
            name = _name(r)
            L.append(f"- {r['suite']} `{name}` rep {r['rep']}: **{r['error_type']}**: {r['reason'] or ''}")
        L.append("")
    pending = [r for r in rows if r["status"] in ("planned", "running")]
    if pending:
        names = ", ".join(f"`{_name(r)}` rep {r['rep']}" for r in pending)
        L.append(f"{len(pending)} repetition(s) never finished (planned/running): {names}")
        L.append("")
    notes = [r for r in rows if r["status_note"] and r["status"] != "unknown"]
    if notes:
        L.append("Notes:")
        L += [f"- `{_name(r)}` rep {r['rep']}: {r['status_note']}" for r in notes]
        L.append("")

    # ---- per-case table
    lookup: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for a in agg:
        lookup.setdefault((a["suite"], a["case_id"], a["role"]), {})[a["metric"]] = a
    for suite, title in (
        ("fixed", "Fixed cases"),
        ("files", "Result files"),
        ("mixed", "Mixed runs, per role"),
    ):
        keys = [k for k in lookup if k[0] == suite]
        if not keys:
            continue
        L += [f"## {title}", ""]
        L.append(
            "Workload per row; each cell = the statistic in the header (per run), then the mean over the "
            "repetitions [bootstrap 95% CI]. ms unless stated."
        )
        L.append("")
        header = ["case", "ISL", "OSL", "concurrency", "requests/rep", "reps (unknown)", "output tok/s",
                  "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "ITL p95 (per token)", "E2E p95",
                  "CV output tok/s"]  # fmt: skip
        body = []
        for k in keys:
            m = lookup[k]
            first = next(iter(m.values()))
            name = f"{k[1]}/{k[2]}" if k[2] and k[2] not in k[1] else k[1]
            cv = m.get("output_throughput", {}).get("cv", math.nan)
            body.append([
                f"`{name}`", _n(first["isl"]), _n(first["osl"]), _n(first["concurrency"]),
                _n(first["num_prompts"]),
                f"{first['n_reps']} ({first['n_unknown']})", _ci(m.get("output_throughput")),
                _ci(m.get("ttft_p50_ms")), _ci(m.get("ttft_p95_ms")), _ci(m.get("tpot_p50_ms"), 2),
                _ci(m.get("tpot_p95_ms"), 2), _ci(m.get("itl_p95_ms"), 2), _ci(m.get("e2e_p95_ms")),
                f"{cv * 100:.1f}%" if math.isfinite(cv) else "n/a",
            ])  # fmt: skip
        L += _table(header, body)
        L.append("")

    # ---- A/B
    if any(r["suite"] == "mixed" for r in rows):
        L += ["## Mixed A/B: decode_background vs control", ""]
        bg = next((r for r in rows if r["role"] == "decode_background"), None)
        inj = next((r for r in rows if r["role"] == "prefill_injection"), None)
        if bg:
            L.append(
                f"Workload: background/control ISL {bg['isl']}, OSL {bg['osl']}, "
                f"concurrency {bg['concurrency']}, "
                f"{bg['num_prompts']} requests per rep; injection ISL {inj['isl'] if inj else 'n/a'}, "
                f"OSL {inj['osl'] if inj else 'n/a'}, concurrency {inj['concurrency'] if inj else 'n/a'}; "
                f"{len(ab_info.get('pairs', []))} valid rep pair(s) {ab_info.get('reps', [])}."
            )
            L.append("")
        if ab:
            header = ["metric", "statistic", "control", "background", "change", "95% CI of change",
                      "Mann-Whitney p", "verdict", "requests (ctrl/bg)"]  # fmt: skip
            body = []
            for r in ab:
                digits = 2 if r["metric"] == "TPOT" else 1
                unit = "" if r["metric"].startswith("output") else " ms"
                ci = (
                    f"[{r['ci95_low']:+.1f}%, {r['ci95_high']:+.1f}%]"
                    if math.isfinite(r["ci95_low"]) and math.isfinite(r["ci95_high"])
                    else "n/a"
                )
                p = r["mann_whitney_p"]
                body.append([
                    r["metric"], r["statistic"],
                    _n(r["control"], digits) + unit, _n(r["background"], digits) + unit,
                    f"{r['change_pct']:+.1f}%" if math.isfinite(r["change_pct"]) else "n/a", ci,
                    f"{p:.3g}" if math.isfinite(p) else "n/a", r["verdict"],
                    "per rep" if r["control_requests"] is None
                    else f"{r['control_requests']}/{r['background_requests']}",
                ])  # fmt: skip
            L += _table(header, body)
        else:
            L.append(
                "**No valid A/B pair**: a repetition needs both control and decode_background completed "
                "(a background that finished before the injection is a failure, not a result)."
            )
        L.append("")

    # ---- definitions, plots
    L += ["## Metric definitions", "", DEFINITIONS, ""]
    client_table = clients.definitions_table(sorted({str(r.get("source_format")) for r in rows}))
    if client_table:
        L += [
            "Clients in this run, per column (`=` same definition, `≈` same quantity measured at a "
            "slightly different point, `—` not available; aggregates never pool two clients):",
            "",
        ]
        L += [*client_table, ""]
    if plots:
        L += ["## Plots", ""]
        L += [f"![{Path(p).stem}]({p})" for p in plots]
        L.append("")
    L += [
        "Per-repetition figures: `summary.csv` / `summary.jsonl`; aggregates: `aggregate.csv`; "
        "A/B: `ab.csv`.",
        "",
    ]
    return "\n".join(L)
