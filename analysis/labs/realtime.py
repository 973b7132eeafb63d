"""The emulator's realtime verdict on a lab variant: each run judged from its own /metrics scrapes.

Why: the quick map judges each case with module_utils/emulation_verdict.py (the two scrapes around
the case: emulated vs busy wall seconds, slips, late steps). A lab run is a case of its own, so the
labs call the same judge on each run's `metrics_before.prom` / `metrics_after.prom` and combine a
variant's runs (the worst run wins; a figure stands only where it stands in every run), one judge
for both (issue 13). A run without scrapes falls back to the server life's schedule lag
(analysis/evidence/honesty.py), and the lab says which reader judged (the VERDICT_READS pitfall).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.evidence import honesty
from module_utils import emulation_verdict

SCRAPES = "scrapes"  # the run's own metrics_before.prom / metrics_after.prom
FALLBACK = "schedule lag (fallback)"  # the server life's sched_lag_ms, analysis/evidence/honesty.py
SERVER_LIFE = "(server life)"  # the reader's key when the variant has no run to judge
_DETAIL_KEYS = ("verdict", "realtime_factor", "late_step_share", "reasons", "stands")
# what still stands under a fallback verdict (it has no per-figure evidence)
_FALLBACK_STANDS = {
    "ok": {"tpot": True, "throughput": True, "ttft": True, "itl_tail": True},
    "degraded": {"tpot": True, "throughput": False, "ttft": False, "itl_tail": False},
}


def run_verdict(rdir: Path) -> dict[str, Any] | None:
    """The judge's verdict on one run from its two scrapes; None when it has neither (or a real
    engine's); "unknown" when a scrape is unreadable (named), never a guess."""
    try:
        return emulation_verdict.read_case(str(rdir))
    except ValueError as exc:
        return {"emulated": True, "verdict": "unknown", "reasons": [f"unparsable /metrics scrape: {exc}"]}


def _has_scrape(rdir: Path) -> bool:
    return (rdir / "metrics_before.prom").is_file() or (rdir / "metrics_after.prom").is_file()


def _fallback(lag: dict[str, Any] | None) -> dict[str, Any] | None:
    verdict, reason = honesty.realtime_verdict(lag)
    if verdict is None:
        return None
    return {
        "emulated": True,
        "verdict": verdict,
        "reasons": [reason],
        "stands": dict(_FALLBACK_STANDS.get(verdict, dict.fromkeys(_FALLBACK_STANDS["ok"], False))),
    }


def variant_verdict(
    runs: dict[str, tuple[Path, bool]], lag: dict[str, Any] | None
) -> tuple[str | None, str, dict[str, Any]]:
    """(verdict, reason, detail) of one variant.

    ``runs``: run name -> (its directory, whether it completed); ``lag``: the server life's schedule
    lag in emulated ms (honesty.py's input), None for a real engine. ``detail`` holds each run's
    verdict and reader (``reads``), and the combined verdict.
    """
    per_run: dict[str, dict[str, Any]] = {}
    reads: dict[str, str] = {}
    for name, (rdir, ok) in runs.items():
        v = run_verdict(rdir) if _has_scrape(rdir) else None
        if v is not None:
            reads[name] = SCRAPES
        elif ok and not _has_scrape(rdir):
            v = _fallback(lag)
            if v is not None:
                reads[name] = FALLBACK
        if v is not None:
            per_run[name] = v
    if not per_run:
        fb = _fallback(lag)  # no run to judge (the variant never ran one): the server life's lag
        if fb is None:
            return None, "not emulated", {"runs": {}, "reads": {}}
        return fb["verdict"], fb["reasons"][0], {"runs": {}, "reads": {SERVER_LIFE: FALLBACK}}
    combined = emulation_verdict.combine(list(per_run.values())) or {"verdict": None, "stands": {}}
    bad = [
        f"{name}: {v['verdict']} ({'; '.join(v.get('reasons') or []) or 'no reason given'})"
        for name, v in per_run.items()
        if v.get("verdict") != "ok"
    ]
    rtfs = [v.get("realtime_factor") for v in per_run.values() if v.get("realtime_factor") is not None]
    said = f"{len(per_run)} run(s) judged"
    if rtfs:
        said += f", realtime factor {min(rtfs):.3f}..{max(rtfs):.3f}"
    reason = said + (": " + "; ".join(bad) if bad else ": every run kept its schedule")
    detail = {
        "runs": {name: {k: v.get(k) for k in _DETAIL_KEYS} for name, v in per_run.items()},
        "reads": reads,
        "stands": combined["stands"],
    }
    return combined["verdict"], reason, detail


def lab_verdict(variants: dict[str, tuple[str | None, dict[str, Any]]]) -> dict[str, Any] | None:
    """The lab's realtime verdict: its variants' combined the same way (worst wins, a figure stands
    only where it stands in every variant); None when no variant was emulated.

    ``variants``: name -> (its verdict, its detail from variant_verdict)."""
    parts = [
        {"verdict": verdict, "stands": detail.get("stands") or {}, "reasons": []}
        for verdict, detail in variants.values()
        if verdict is not None
    ]
    out = emulation_verdict.combine(parts)
    if out is None:
        return None
    return {"verdict": out["verdict"], "stands": out["stands"]}


def reads_pitfall(name: str, detail: dict[str, Any]) -> str | None:
    """VERDICT_READS: a variant any of whose verdicts came from the fallback reader, naming the runs."""
    fallback = sorted(r for r, how in (detail.get("reads") or {}).items() if how == FALLBACK)
    if not fallback:
        return None
    if fallback == [SERVER_LIFE]:
        return (
            f"VERDICT_READS {name}: no run with /metrics scrapes (the variant ran no load), so its realtime "
            "verdict came from the server's schedule lag over its whole life (the fallback reader, "
            "analysis/evidence/honesty.py)"
        )
    return (
        f"VERDICT_READS {name}: the realtime verdict of {', '.join(fallback)} came from the server's "
        "schedule lag over its whole life (the fallback reader, analysis/evidence/honesty.py), not from "
        "the run's own /metrics scrapes: it cannot tell which run the emulator was late in"
    )
