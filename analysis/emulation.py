"""Emulated cases: their realtime verdict, and their figures in the emulated hardware's units.

Why: an enginesim case runs at its own time scale (ENGINESIM_TIME_SCALE=auto picks one per case), so
its wall-clock figures mean nothing until divided by that scale, and only while the emulator kept to
its schedule. Each repetition's verdict comes from the one judge (module_utils/emulation_verdict.py,
fed with the case's metrics_before.prom / metrics_after.prom, the same call the bench_case action
makes for meta.json). summary.csv keeps the wall-clock figures as measured plus these columns; the
aggregates, the A/B, the plots and the report use the de-scaled copies (latencies ÷ scale,
throughputs × scale), aggregated separately per verdict so that a saturated repetition is never
pooled with good ones. A run on a real engine has no verdict and passes through unchanged.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from module_utils.emulation_verdict import case_verdict

COLUMNS = [
    "emulation_verdict", "time_scale", "realtime_factor", "emulated_s", "busy_wall_s", "slip_s",
    "late_step_share", "scale_set_by", "emulation_reasons",
]  # fmt: skip
THROUGHPUT_KEYS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _set_by(case_dir: Path) -> str | None:
    """What fixed the case's time scale, from pace.json (the server's answer before the case)."""
    text = _read(case_dir / "pace.json")
    if not text:
        return None
    try:
        pace = json.loads(text)
    except ValueError:
        return None
    if not isinstance(pace, dict):
        return None
    if pace.get("applied"):
        return str(pace.get("set_by"))
    return f"unchanged: {pace.get('reason', 'not applied')}"


def attach(row: dict[str, Any], case_dir: Path) -> None:
    """Add the verdict columns of one repetition (all None for a real engine)."""
    for c in COLUMNS:
        row.setdefault(c, None)
    try:
        v = case_verdict(_read(case_dir / "metrics_before.prom"), _read(case_dir / "metrics_after.prom"))
    except ValueError as exc:  # a scrape the parser refuses: say so, never guess
        v = {"verdict": "unknown", "reasons": [f"unparsable /metrics scrape: {exc}"]}
    if v is None:
        return
    row.update(
        emulation_verdict=v.get("verdict"),
        time_scale=v.get("time_scale"),
        realtime_factor=v.get("realtime_factor"),
        emulated_s=v.get("emulated_s"),
        busy_wall_s=v.get("wall_s"),
        slip_s=v.get("slip_s"),
        late_step_share=v.get("late_step_share"),
        scale_set_by=_set_by(case_dir),
        emulation_reasons="; ".join(v.get("reasons") or []),
    )


def _scale(row: dict[str, Any]) -> float | None:
    s = row.get("time_scale")
    return float(s) if isinstance(s, int | float) and math.isfinite(s) and s > 0 else None


def descale_row(row: dict[str, Any]) -> dict[str, Any]:
    """A copy in emulated units (latencies ÷ scale, throughputs × scale, duration ÷ scale)."""
    s = _scale(row)
    if s is None:
        return row
    out = dict(row)
    for k, v in row.items():
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if k.endswith("_ms") or k == "duration_s":
            out[k] = v / s
        elif k in THROUGHPUT_KEYS:
            out[k] = v * s
    return out


def _descale_data(data: Any, s: float) -> Any:
    d = copy.copy(data)
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        arr = getattr(data, name)
        if arr is not None:
            setattr(d, name, arr / s)
    d.stats = {k: (v / s if k.endswith("_ms") else v) for k, v in data.stats.items()}
    if data.timeline is not None and data.t0_epoch_s is not None and data.main_start_s is not None:
        origin = data.t0_epoch_s + data.main_start_s
        epoch, itl = data.timeline
        d.timeline = (origin + (epoch - origin) / s, itl / s)
    return d


def view(
    rows: list[dict[str, Any]], datas: dict[int, Any], injections: dict[Any, float], entries: list[Any]
) -> tuple[list[dict[str, Any]], dict[int, Any], dict[Any, float], bool]:
    """(rows, datas, injection times) in emulated units, and whether any row was emulated."""
    out_rows = [descale_row(r) for r in rows]
    out_datas = {i: (_descale_data(d, s) if (s := _scale(rows[i])) else d) for i, d in datas.items()}
    out_inj = dict(injections)
    for i, e in enumerate(entries):
        s = _scale(rows[i])
        d = datas.get(i)
        background = e.suite == "mixed" and e.role == "decode_background"
        if s is None or d is None or not background or e.rep not in out_inj:
            continue
        if d.t0_epoch_s is not None and d.main_start_s is not None:
            origin = d.t0_epoch_s + d.main_start_s
            out_inj[e.rep] = origin + (injections[e.rep] - origin) / s
    emulated = any(r.get("emulation_verdict") for r in rows)
    return out_rows, out_datas, out_inj, emulated


def aggregate_by_verdict(rows: list[dict[str, Any]], aggregate: Any) -> list[dict[str, Any]]:
    """`aggregate` run once per verdict class, so repetitions of different verdicts are never pooled;
    each aggregate row says its verdict and the time scales of its repetitions."""
    classes: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        classes.setdefault(r.get("emulation_verdict"), []).append(i)
    if list(classes) == [None]:
        return [dict(a, emulation_verdict=None, time_scales=None) for a in aggregate(rows)]
    out: list[dict[str, Any]] = []
    for verdict, idx in classes.items():
        members = [rows[i] for i in idx]
        scales: dict[tuple[str, str, str], set[float]] = {}
        for r in members:
            if _scale(r) is not None:
                scales.setdefault((r["suite"], r["case_id"], r["role"]), set()).add(float(r["time_scale"]))
        for a in aggregate(members):
            got = sorted(scales.get((a["suite"], a["case_id"], a["role"]), ()))
            shown = "/".join(f"{s:g}" for s in got) or None
            out.append(dict(a, emulation_verdict=verdict, time_scales=shown))
    return out
