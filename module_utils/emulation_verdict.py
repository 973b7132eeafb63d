# Copyright: quickmap contributors
# Apache-2.0
"""The emulator's realtime verdict on one case, from the /metrics scrapes taken before and after it.

An emulated case's figures are the emulated hardware's only if enginesim kept to its schedule while the
case ran. enginesim counts that under ``enginesim:*`` (enginesim/README.md, Pacing): emulated
seconds, busy wall seconds, slips, and how late each step was written in units of the step. This
module turns the difference of two scrapes into one verdict, the single judge that the ``bench_case``
action plugin (meta.json) and ``analysis summarize`` (summary.csv, report) both call:

- ``ok``: every figure the report prints is expected within tolerance of the emulated hardware's
  (TTFT/TPOT p50 and throughput within 5 %, ITL p95 within 10 %): the realtime factor is at least
  ``RTF_OK``, at most ``LATE_SHARE_MAX`` of the steps were written later than ``LATE_STEP`` of a step,
  and the emulator's own lateness (slips since each request reached the host, steps it joined late
  because it was read after a plan it was due for, its first token's late write) was at most
  ``TTFT_LATE_SHARE_MAX`` of the TTFTs (``ttft_late_seconds_total`` / ``ttft_wall_seconds_total``);
- ``degraded``: TPOT p50 still holds (realtime factor at least ``RTF_DEGRADED``), throughput only if
  the realtime factor is at least ``RTF_OK``, and ``stands`` lists what else does not hold: ``ttft``
  (the emulator was late inside the TTFTs) and/or
  ``itl_tail`` (too many late steps: ITL p95/p99 are not the hardware's);
- ``saturated``: the emulator fell behind (realtime factor below ``RTF_DEGRADED``), or its time scale
  changed during the case: no figure of the case stands for the emulated hardware;
- ``unknown``: the case ran on enginesim but a scrape is missing, or no step ran.

The realtime factor is emulated seconds × time scale / busy wall seconds: 1.0 means the emulator
kept to its schedule, 0.5 that it ran at half the speed it promised. A result with no ``enginesim:``
metrics (a real engine) gets no verdict (``None``).

Controller side only (the action plugin and analysis import it; no module does): the text is parsed
with prometheus_client's parser, the format's reference implementation.
"""

from __future__ import annotations

import math

PREFIX = "enginesim:"
RTF_OK = 0.98
RTF_DEGRADED = 0.95
LATE_STEP = 0.1  # a step written later than this share of its own length counts as late
# A p95 moves as soon as late gaps approach 5 % of them: the tail stands only well below that (a case with
# 1.1 % late steps measured ITL p95 1.17x the replay's).
LATE_SHARE_MAX = 0.01
TTFT_LATE_SHARE_MAX = 0.025  # the emulator's own lateness (slips, late writes) inside the TTFTs
VERDICTS = ("ok", "degraded", "saturated", "unknown")


# The enginesim families the verdict reads (sample names add _total / _bucket / _sum / _count).
FAMILIES = frozenset(
    PREFIX + name
    for name in (
        "time_scale",
        "time_scale_auto",
        "time_scale_changes",
        "emulated_seconds",
        "wall_seconds",
        "slip_seconds",
        "slips",
        "steps",
        "events",
        "step_lag_steps",
        "first_tokens",
        "ttft_wall_seconds",
        "ttft_late_seconds",
    )
)
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
_COMMENTS = ("# HELP ", "# TYPE ", "# UNIT ")


def _family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _known(name: str) -> bool:
    return name in FAMILIES or _family(name) in FAMILIES


def _wanted(line: str) -> bool:
    """A line of one of FAMILIES (its sample or its HELP/TYPE comment)."""
    if line.startswith(PREFIX):
        return _known(line.split(" ", 1)[0].split("{", 1)[0])
    if line.startswith(_COMMENTS):
        parts = line.split(" ", 3)
        return len(parts) > 2 and _known(parts[2])
    return False


def own_lines(text: str) -> str:
    """The lines of the families the verdict reads, the others dropped before any parsing.

    Why: an enginesim /metrics page is mostly the engine's own families (histograms per label set);
    handing all of it to the parser cost 5.3 ms per scrape against 0.72 ms for these lines (a real
    21.8 KB SGLang-flavour scrape after 20 requests; vLLM flavour 10.3 vs 1.4 ms, load ~3 on 2 cores),
    and a broken line in a family the verdict never reads must not make it "unparsable" (issue 13).
    """
    return "".join(line + "\n" for line in text.splitlines() if _wanted(line))


def parse(text: str | None) -> dict[str, object] | None:
    """The ``enginesim:*`` samples of one scrape that the verdict reads (FAMILIES): plain values by
    sample name, histogram buckets under ``(name, le)``; None when the text holds none (not an
    enginesim server, or no scrape). Raises ValueError on a broken line of those families only."""
    if not text:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[object, float] = {}
    for family in text_string_to_metric_families(own_lines(text)):
        if not family.name.startswith(PREFIX):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                out[(s.name, float(s.labels["le"]))] = s.value
            else:
                out[s.name] = s.value
    return out or None


def _delta(before: dict, after: dict, name: str) -> float:
    return float(after.get(name, 0.0)) - float(before.get(name, 0.0))


def _late_share(
    before: dict, after: dict, steps: float, name: str = PREFIX + "step_lag_steps_bucket"
) -> tuple[float, float | None]:
    """(share of steps later than LATE_STEP of a step, p95 lateness in steps as a bucket bound)."""
    bounds = sorted(le for (n, le) in (k for k in after if isinstance(k, tuple)) if n == name)
    if not bounds or steps <= 0:
        return math.nan, None
    on_time = _delta(before, after, (name, LATE_STEP))  # type: ignore[arg-type]
    p95 = None
    for le in bounds:
        if _delta(before, after, (name, le)) >= 0.95 * steps:  # type: ignore[arg-type]
            p95 = le
            break
    return max(0.0, 1.0 - on_time / steps), p95


def case_verdict(before_text: str | None, after_text: str | None) -> dict | None:
    """The verdict of one case from its two scrapes (see the module docstring); None for a real engine.

    Every number in the result is finite or None (it goes into meta.json and summary.csv)."""
    out = _judge(parse(before_text), parse(after_text))
    if out is None:
        return None
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def _judge(before: dict | None, after: dict | None) -> dict | None:
    if before is None and after is None:
        return None
    out: dict = {"emulated": True, "verdict": "unknown", "reasons": []}
    if before is None or after is None:
        out["reasons"].append(
            f"metrics_{'before' if before is None else 'after'}.prom has no enginesim evidence"
        )
        ev = after or before or {}
        out["time_scale"] = ev.get(PREFIX + "time_scale")
        return out
    scale = float(after.get(PREFIX + "time_scale", math.nan))
    emulated = _delta(before, after, PREFIX + "emulated_seconds_total")
    wall = _delta(before, after, PREFIX + "wall_seconds_total")
    steps = _delta(before, after, PREFIX + "steps_total")
    late, p95 = _late_share(before, after, steps)
    ttft_wall = _delta(before, after, PREFIX + "ttft_wall_seconds_total")
    ttft_late = _delta(before, after, PREFIX + "ttft_late_seconds_total")
    ttft_share = ttft_late / ttft_wall if ttft_wall > 0 else math.nan
    rtf = emulated * scale / wall if wall > 0 else math.nan
    out.update(
        time_scale=scale,
        time_scale_auto=bool(after.get(PREFIX + "time_scale_auto")),
        realtime_factor=rtf,
        emulated_s=emulated,
        wall_s=wall,
        slip_s=_delta(before, after, PREFIX + "slip_seconds_total"),
        slips=int(_delta(before, after, PREFIX + "slips_total")),
        steps=int(steps),
        events=int(_delta(before, after, PREFIX + "events_total")),
        late_step_share=late,
        lag_steps_p95=p95,
        first_tokens=int(_delta(before, after, PREFIX + "first_tokens_total")),
        ttft_late_share=ttft_share,
        stands={"tpot": False, "throughput": False, "ttft": False, "itl_tail": False},
    )
    reasons: list[str] = out["reasons"]
    changes = _delta(before, after, PREFIX + "time_scale_changes_total")
    if steps <= 0 or not math.isfinite(rtf):
        reasons.append("no step ran during the case")
        return out
    if changes > 0:
        reasons.append(f"the time scale changed {int(changes)} time(s) during the case")
    if rtf < RTF_DEGRADED:
        reasons.append(f"realtime factor {rtf:.3f} < {RTF_DEGRADED}: the emulator fell behind its schedule")
    if changes > 0 or rtf < RTF_DEGRADED:
        out["verdict"] = "saturated"
        return out
    stands = out["stands"]
    stands["tpot"] = True
    # throughput also counts the gaps between requests (client turnaround, reading the next one),
    # which the busy-time evidence does not see: vouched for only when the case kept its schedule
    stands["throughput"] = stands["ttft"] = stands["itl_tail"] = rtf >= RTF_OK
    if rtf < RTF_OK:
        reasons.append(f"realtime factor {rtf:.3f} < {RTF_OK}")
    if math.isfinite(late) and late > LATE_SHARE_MAX:
        stands["itl_tail"] = False
        reasons.append(
            f"{late:.1%} of steps written later than {LATE_STEP:.0%} of a step (limit {LATE_SHARE_MAX:.1%}): "
            "tail latencies are not the emulated hardware's"
        )
    if math.isfinite(ttft_share) and ttft_share > TTFT_LATE_SHARE_MAX:
        stands["ttft"] = False
        reasons.append(
            f"the emulator's lateness was {ttft_share:.1%} of the TTFTs (limit {TTFT_LATE_SHARE_MAX:.1%}): "
            "TTFT is not the emulated hardware's"
        )
    out["verdict"] = "degraded" if reasons else "ok"
    return out


# Worst first: a saturated part means no figure stands; an unknown part means the evidence is missing,
# which is worse than a known degradation (nothing says which figures still hold).
SEVERITY = ("saturated", "unknown", "degraded", "ok")


def combine(verdicts: list[dict | None]) -> dict | None:
    """One verdict over several parts (a lab variant's runs): the worst part's verdict wins and a figure
    stands only where it stands in every part.

    Why: a variant's figures come from all of its runs; one run the emulator could not keep up with
    is enough to make the variant's timing untrustworthy. Parts that are None (a real engine) are
    skipped; None when every part is.
    """
    parts = [v for v in verdicts if v is not None]
    if not parts:
        return None
    worst = min(parts, key=lambda v: SEVERITY.index(v.get("verdict", "unknown")))
    out: dict = {"emulated": True, "verdict": worst.get("verdict", "unknown"), "parts": len(parts)}
    keys = ("tpot", "throughput", "ttft", "itl_tail")
    out["stands"] = {k: all(bool((v.get("stands") or {}).get(k)) for v in parts) for k in keys}
    out["reasons"] = [r for v in parts for r in v.get("reasons", [])]
    rtfs = [v["realtime_factor"] for v in parts if isinstance(v.get("realtime_factor"), int | float)]
    out["realtime_factor"] = min(rtfs) if rtfs else None
    scales = {v.get("time_scale") for v in parts if v.get("time_scale") is not None}
    out["time_scale"] = scales.pop() if len(scales) == 1 else None
    return out


def scrape_names(client: str = "") -> tuple[str, str]:
    """The (before, after) scrape file names of one client's window in a case directory.

    loadgen's window is the case's own (``metrics_before.prom``); a reference client that ran after it
    in the same case has its own (``metrics_before_sglang.prom``), so each client's figures are judged
    on the emulator's behaviour while that client ran, not while the other one did."""
    suffix = f"_{client}" if client else ""
    return f"metrics_before{suffix}.prom", f"metrics_after{suffix}.prom"


def read_case(case_dir: str, client: str = "") -> dict | None:
    """case_verdict of a case directory's scrapes around one client's run (missing = None).

    ``client`` empty: the case's own window (loadgen's); ``sglang``/``vllm``: that reference client's."""
    import os

    texts = []
    for name in scrape_names(client):
        path = os.path.join(case_dir, name)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        except OSError:
            texts.append(None)
    return case_verdict(texts[0], texts[1])
