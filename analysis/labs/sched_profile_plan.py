"""The runs of the sched_profile lab, and the gate that keeps a variant whose switch the engine lacks.

Why: py-spy samples the scheduler process while a load runs, so each load is sized to last as long as
py-spy records (rate x duration prompts); three request rates show how the scheduler's share grows
with load. One more run at the medium rate is traced by the engine's own profiler (no py-spy on it, so
the trace is not perturbed). The async-scheduling A/B needs a switch that only some engine versions
have: a variant declares it in `requires_flags`, and the variant (with its comparisons) is planned only
when the engine's own --help (read by preflight) lists it; otherwise the plan says why it is absent.
"""

from __future__ import annotations

import math
from typing import Any

from analysis.errors import InputError
from analysis.labs.client_args import random_dataset

LOADS = ("low", "medium", "high")


def _int(w: dict[str, Any], key: str, where: str) -> int:
    v = w.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(None, f"{where}.{key}", f"got {v!r}, expected an integer >= 1")
    return v


def _rate(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or not math.isfinite(v):
        raise InputError(None, where, f"got {v!r}, expected a request rate > 0 (req/s)")
    return float(v)


def plan(r: Any, w: dict[str, Any], where: str) -> None:
    isl, osl, c, duration = (_int(w, k, where) for k in ("isl", "osl", "concurrency", "duration_s"))
    _int(w, "pyspy_rate_hz", where)
    rates = w.get("rates")
    if not isinstance(rates, dict) or set(rates) != set(LOADS):
        raise InputError(
            None, f"{where}.rates", f"got {rates!r}, expected {{low, medium, high}} request rates"
        )
    values = [_rate(rates[k], f"{where}.rates.{k}") for k in LOADS]
    if not values[0] < values[1] < values[2]:
        raise InputError(None, f"{where}.rates", f"got {rates!r}, expected low < medium < high")
    data = random_dataset(isl, osl)
    for load, rate in zip(LOADS, values, strict=True):
        n = max(2, math.ceil(rate * duration))
        wl = {"isl": isl, "osl": osl, "concurrency": c, "num_prompts": n, "warmup": 0, "request_rate": rate}
        r.add(f"load_{load}", wl, data, request_rate=str(rate), expect_output_len=osl, pyspy=True)
    n = max(2, math.ceil(values[1] * duration))
    wl = {"isl": isl, "osl": osl, "concurrency": c, "num_prompts": n, "warmup": 0, "request_rate": values[1]}
    r.add("trace", wl, data, request_rate=str(values[1]), expect_output_len=osl, profile=True)


def gate(definition: Any, engine_flags: Any, where: str) -> tuple[Any, list[dict[str, Any]]]:
    """The definition without the variants whose `requires_flags` the engine's --help does not list.

    `engine_flags` is the list preflight read from the engine's --help (None: not read, e.g. in check
    mode): a variant that needs a flag is then left out too, with that reason.
    """
    if not isinstance(definition, dict) or not isinstance(definition.get("variants"), list):
        return definition, []
    known = set(engine_flags) if isinstance(engine_flags, list) else None
    kept, dropped = [], []
    for i, v in enumerate(definition["variants"]):
        need = v.get("requires_flags", []) if isinstance(v, dict) else []
        if not isinstance(need, list) or not all(isinstance(f, str) for f in need):
            raise InputError(
                None, f"{where}.variants[{i}].requires_flags", f"got {need!r}, expected flag names"
            )
        missing = [f for f in need if known is None or f not in known]
        if not missing:
            kept.append({k: x for k, x in v.items() if k != "requires_flags"} if isinstance(v, dict) else v)
            continue
        why = (
            "the engine's --help was not read (preflight did not run it)"
            if known is None
            else f"the engine's --help does not list {', '.join(missing)}"
        )
        dropped.append({"variant": v.get("name"), "requires_flags": need, "reason": why})
    names = {d["variant"] for d in dropped}
    comparisons = [
        c
        for c in definition.get("comparisons", []) or []
        if not (isinstance(c, dict) and (c.get("baseline") in names or c.get("treatment") in names))
    ]
    return dict(definition, variants=kept, comparisons=comparisons), dropped
