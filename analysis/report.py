"""report.md: every latency figure with its workload (ISL, OSL, concurrency, requests, reps)
and its statistic, plus statuses, the A/B table, the metric definitions and the plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from analysis import clients, crosscheck
from analysis.setup_record import setup_lines

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


def _emulation_note(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """An emulated run must never pass for a GPU measurement: say so, with the time scale each case
    actually ran at (its /metrics evidence), never the configured one when the evidence differs."""
    env = manifest.get("engine_env")
    configured = isinstance(env, dict) and any(str(k).startswith("ENGINESIM_") for k in env)
    scales = sorted({float(r["time_scale"]) for r in rows if isinstance(r.get("time_scale"), int | float)})
    if scales:
        shown = f"{scales[0]:g}" if len(scales) == 1 else f"per case, {scales[0]:g} to {scales[-1]:g}"
        return [
            f"- **emulated engine (enginesim), time scale {shown}** (from each case's /metrics evidence; "
            "column `time scale`): every latency and throughput below is the emulated hardware's, i.e. "
            "the wall-clock figure divided by its case's time scale (throughput multiplied by it), and "
            "stands only where the case's verdict is **ok** (the emulator kept to its schedule). The "
            "wall-clock figures are in summary.csv. Not a GPU measurement."
        ]
    if not configured:
        return []
    scale = env.get("ENGINESIM_TIME_SCALE", "1.0")
    return [
        f"- **emulated engine (enginesim), time scale {scale}** as configured (ENGINESIM_TIME_SCALE), but no "
        "case carries the emulator's /metrics evidence: the figures below are wall-clock, not de-scaled, "
        "and have no realtime verdict. Not a GPU measurement."
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


def _header(run_dir: Path, manifest: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
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
    L += _emulation_note(manifest, rows)
    L += setup_lines(manifest, run_dir)
    reasons = manifest.get("abort_reasons")
    if isinstance(reasons, list) and reasons:
        L.append("- **run stopped early**: " + "; ".join(map(str, reasons)))
    L.append("")
    if not rows:
        L += [
            "**No case ran**: the run directory holds no `cases/<case>/rep<N>/` or `mixed/rep<N>/<role>/`.",
            "",
        ]
    return L


def _status(rows: list[dict[str, Any]], unreadable: list[tuple[str, str]] | None) -> list[str]:
    L = ["## Status"]
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
    return L


def _verdict_cell(verdict: Any) -> str:
    """ok as is; anything else flagged so that no reader takes it for the emulated hardware's figure."""
    if verdict is None:
        return "n/a"
    return "ok" if verdict == "ok" else f"**{verdict}** ⚠"


def _rtf_range(rows: list[dict[str, Any]], key: tuple[str, str, str, Any]) -> str:
    vals = [
        float(r["realtime_factor"])
        for r in rows
        if (r["suite"], r["case_id"], r["role"], r.get("emulation_verdict")) == key
        and isinstance(r.get("realtime_factor"), int | float)
    ]
    if not vals:
        return "n/a"
    lo, hi = min(vals), max(vals)
    return f"{lo:.3f}" if lo == hi else f"{lo:.3f}–{hi:.3f}"


def _case_tables(rows: list[dict[str, Any]], agg: list[dict[str, Any]]) -> list[str]:
    """One row per case and verdict: repetitions of different verdicts are never pooled."""
    L: list[str] = []
    emulated = any(r.get("emulation_verdict") for r in rows)
    lookup: dict[tuple[str, str, str, Any], dict[str, dict[str, Any]]] = {}
    for a in agg:
        key = (a["suite"], a["case_id"], a["role"], a.get("emulation_verdict"))
        lookup.setdefault(key, {})[a["metric"]] = a
    for suite, title in (
        ("fixed", "Fixed cases"),
        ("files", "Result files"),
        ("mixed", "Mixed runs, per role"),
    ):
        keys = [k for k in lookup if k[0] == suite]
        if not keys:
            continue
        L += [f"## {title}" + (" (emulated hardware)" if emulated else ""), ""]
        L.append(
            "Workload per row; each cell = the statistic in the header (per run), then the mean over the "
            "repetitions [bootstrap 95% CI]. ms unless stated."
            + (
                " Emulated run: figures de-scaled by each repetition's time scale; repetitions with "
                "different verdicts are separate rows, and a row that is not **ok** does not stand for "
                "the emulated hardware."
                if emulated
                else ""
            )
        )
        L.append("")
        header = ["case", "ISL", "OSL", "concurrency", "requests/rep", "reps (unknown)", "output tok/s",
                  "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "ITL p95 (per token)", "E2E p95",
                  "CV output tok/s"]  # fmt: skip
        if emulated:
            header += ["verdict", "time scale", "realtime factor"]
        body = []
        for k in keys:
            m = lookup[k]
            first = next(iter(m.values()))
            name = f"{k[1]}/{k[2]}" if k[2] and k[2] not in k[1] else k[1]
            cv = m.get("output_throughput", {}).get("cv", math.nan)
            line = [
                f"`{name}`", _n(first["isl"]), _n(first["osl"]), _n(first["concurrency"]),
                _n(first["num_prompts"]),
                f"{first['n_reps']} ({first['n_unknown']})", _ci(m.get("output_throughput")),
                _ci(m.get("ttft_p50_ms")), _ci(m.get("ttft_p95_ms")), _ci(m.get("tpot_p50_ms"), 2),
                _ci(m.get("tpot_p95_ms"), 2), _ci(m.get("itl_p95_ms"), 2), _ci(m.get("e2e_p95_ms")),
                f"{cv * 100:.1f}%" if math.isfinite(cv) else "n/a",
            ]  # fmt: skip
            if emulated:
                line += [_verdict_cell(k[3]), first.get("time_scales") or "n/a", _rtf_range(rows, k)]
            body.append(line)
        L += _table(header, body)
        L.append("")
    return L


def _emulation_evidence(rows: list[dict[str, Any]]) -> list[str]:
    """Per repetition: the scale it ran at, what chose it, how well the emulator kept to it."""
    em = [r for r in rows if r.get("emulation_verdict")]
    if not em:
        return []
    counts: dict[str, int] = {}
    for r in em:
        counts[r["emulation_verdict"]] = counts.get(r["emulation_verdict"], 0) + 1
    L = ["## Emulation: time scale and realtime verdict per repetition", ""]
    L.append(
        "From each repetition's `metrics_before.prom` / `metrics_after.prom` (enginesim's `enginesim:*` "
        "counters) and `pace.json`. Realtime factor = emulated seconds × time scale ÷ busy wall seconds "
        "(1.000 = on schedule). **ok**: every figure within tolerance of the emulated hardware; "
        "**degraded**: TPOT p50 holds, the reasons say what does not; **saturated**: the emulator "
        "fell behind, no figure stands. Verdicts: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + "."
    )
    L.append("")
    header = ["case", "rep", "verdict", "time scale", "set by", "realtime factor", "emulated s", "wall s",
              "slip s", "late steps", "why"]  # fmt: skip
    body = []
    for r in em:
        late = r.get("late_step_share")
        body.append([
            f"`{_name(r)}`", str(r["rep"]), _verdict_cell(r["emulation_verdict"]), _n(r.get("time_scale"), 3),
            str(r.get("scale_set_by") or "n/a"), _n(r.get("realtime_factor"), 3), _n(r.get("emulated_s"), 3),
            _n(r.get("busy_wall_s"), 2), _n(r.get("slip_s"), 3),
            f"{late * 100:.1f}%" if isinstance(late, int | float) else "n/a",
            str(r.get("emulation_reasons") or ""),
        ])  # fmt: skip
    L += _table(header, body)
    L.append("")
    return L


def _ab_emulation_cell(rows: list[dict[str, Any]]) -> str | None:
    """The emulation verdicts of the A/B's control and background repetitions, or None (not emulated)."""
    sides = []
    for role in ("control", "decode_background"):
        verdicts = sorted({
            str(r["emulation_verdict"]) for r in rows
            if r["suite"] == "mixed" and r["role"] == role and r.get("emulation_verdict")
        })  # fmt: skip
        sides.append(verdicts)
    if not any(sides):
        return None
    return "/".join(", ".join(_verdict_cell(v) for v in side) or "n/a" for side in sides)


def _ab_section(rows: list[dict[str, Any]], ab: list[dict[str, Any]], ab_info: dict[str, Any]) -> list[str]:
    if not any(r["suite"] == "mixed" for r in rows):
        return []
    L = ["## Mixed A/B: decode_background vs control", ""]
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
    bad = [
        r for r in rows
        if r["suite"] == "mixed" and r["role"] in ("control", "decode_background")
        and r.get("emulation_verdict") not in (None, "ok")
    ]  # fmt: skip
    if bad:
        L.append(
            "**Emulator not on schedule in this A/B** ("
            + ", ".join(f"{r['role']} rep {r['rep']}: {r['emulation_verdict']}" for r in bad)
            + "): the changes below are not the emulated hardware's."
        )
        L.append("")
    if ab:
        header = ["metric", "statistic", "control", "background", "change", "95% CI of change",
                  "Mann-Whitney p", "verdict", "requests (ctrl/bg)"]  # fmt: skip
        emulation = _ab_emulation_cell(rows)
        if emulation is not None:
            header.append("emulation verdict (ctrl/bg)")
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
            ] + ([emulation] if emulation is not None else []))  # fmt: skip
        L += _table(header, body)
    else:
        L.append(
            "**No valid A/B pair**: a repetition needs both control and decode_background completed "
            "(a background that finished before the injection is a failure, not a result)."
        )
    L.append("")
    return L


def _cross_check_section(cross_check: dict[str, Any]) -> list[str]:
    """loadgen beside the reference client per case; says which cases ran loadgen only."""
    compared = cross_check.get("compared") or []
    L = crosscheck.section(compared)
    alone = cross_check.get("loadgen_only") or []
    if compared and alone:
        L += [f"Only loadgen ran (no reference client) in: {', '.join(alone)}.", ""]
    return L


def _footer(rows: list[dict[str, Any]], plots: list[str], more_formats: tuple[str, ...] = ()) -> list[str]:
    L = ["## Metric definitions", "", DEFINITIONS, ""]
    client_table = clients.definitions_table(
        sorted({str(r.get("source_format")) for r in rows} | set(more_formats))
    )
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
    return L


def render(
    run_dir: Path,
    manifest: dict[str, Any],
    rows: list[dict[str, Any]],
    agg: list[dict[str, Any]],
    ab: list[dict[str, Any]],
    ab_info: dict[str, Any],
    plots: list[str],
    unreadable: list[tuple[str, str]] | None = None,
    cross_check: dict[str, Any] | None = None,
) -> str:
    """report.md: header, status, per-case tables, emulation evidence, the A/B, definitions and plots."""
    L = _header(run_dir, manifest, rows)
    L += _status(rows, unreadable)
    L += _case_tables(rows, agg)
    L += _emulation_evidence(rows)
    L += _ab_section(rows, ab, ab_info)
    L += _cross_check_section(cross_check or {})
    refs = tuple(c for comp in (cross_check or {}).get("compared", []) for c in comp["reference"])
    L += _footer(rows, plots, refs)
    return "\n".join(L)
