"""The emulator's own realtime verdict for one server life: ok, degraded or saturated.

Why: on enginesim a figure is only worth printing if the emulator kept its schedule. It records
how late each step's events went out against their deadline (`sched_lag_ms`, p50/p99/max, in
`/server_info` → `enginesim` and in its shutdown line); when it falls more than 50 ms behind it
restarts its clock, and that emulated time is lost. This module turns that evidence into a verdict.

Fallback only: a lab run is judged from its own /metrics scrapes by the quick map's judge
(module_utils/emulation_verdict.py, through analysis/labs/realtime.py). This reader of the server
life's schedule lag is used only for a run that has no scrapes (and then the lab's VERDICT_READS
pitfall says so), with these thresholds:
- saturated: the median step went out more than 5 ms late (the emulator was behind most of the time);
- degraded: the schedule slipped at least once (max lag > 50 ms) or p99 > 20 ms;
- ok: otherwise.
"""

from __future__ import annotations

import re
from typing import Any

SATURATED_P50_MS = 5.0
DEGRADED_MAX_MS = 50.0
DEGRADED_P99_MS = 20.0
_SHUTDOWN = re.compile(
    r"enginesim: sched_lag_ms p50=(?P<p50>-?[\d.]+) p99=(?P<p99>-?[\d.]+) max=(?P<max>-?[\d.]+)"
)


def emulator_evidence(server_info: dict[str, Any] | None, log_text: str | None) -> dict[str, Any] | None:
    """enginesim's block from /server_info (SGLang top level, vLLM dev mode), else its shutdown line.

    None means the server is not enginesim (a real engine): nothing to judge.
    """
    if isinstance(server_info, dict) and isinstance(server_info.get("enginesim"), dict):
        return dict(server_info["enginesim"])
    if log_text:
        found = list(_SHUTDOWN.finditer(log_text))
        if found:
            m = found[-1]  # the last server life in this log
            return {
                "sched_lag_ms": {k: float(m.group(k)) for k in ("p50", "p99", "max")},
                "from": "shutdown line",
            }
    return None


def realtime_verdict(evidence: dict[str, Any] | None) -> tuple[str | None, str]:
    """(verdict, reason); (None, why) when there is no emulator evidence."""
    if evidence is None:
        return None, "not emulated"
    lag = evidence.get("sched_lag_ms") or {}
    try:
        p50, p99, mx = (float(lag[k]) for k in ("p50", "p99", "max"))
    except (KeyError, TypeError, ValueError):
        return "degraded", "enginesim reported no schedule lag: its timing cannot be checked"
    said = f"sched lag p50 {p50:.2f} / p99 {p99:.2f} / max {mx:.2f} ms"
    if p50 > SATURATED_P50_MS:
        return "saturated", f"{said}: the median step was late by more than {SATURATED_P50_MS:g} ms"
    if mx > DEGRADED_MAX_MS or p99 > DEGRADED_P99_MS:
        return "degraded", (
            f"{said}: the schedule slipped (max > {DEGRADED_MAX_MS:g} ms) or its tail was late "
            f"(p99 > {DEGRADED_P99_MS:g} ms); tails of latency figures are stretched"
        )
    return "ok", said
