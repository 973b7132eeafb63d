"""The runs of the TP-scaling lab: one request-rate sweep per TP size, the same prompts for every size.

Why a sweep: below the knee every TP size delivers the offered load, so throughput and its scaling
efficiency only mean something at and past the knee; the sweep finds it per size. Pure: the caller's
run collector (plan._Runs) receives the runs.
"""

from __future__ import annotations

import math
from typing import Any

from analysis.errors import InputError
from analysis.labs.client_args import random_dataset


def _int(w: dict[str, Any], key: str, where: str) -> int:
    v = w.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(None, f"{where}.{key}", f"got {v!r}, expected an integer >= 1")
    return v


def rate_name(rate: float) -> str:
    """Run name of a rate: r5, r12_5 (a directory name: no dot)."""
    return "r" + (str(int(rate)) if float(rate).is_integer() else str(rate).replace(".", "_"))


def time_scale(cfg: dict[str, Any]) -> float:
    """The lab server's ENGINESIM_TIME_SCALE (the lab's environment, plan_config.j2); 1.0 when unset
    (a real engine). The sweep's rates are the emulated hardware's: the client sends them this many
    times slower, so that an emulator running N times slower than real time is offered the same load
    per emulated second (at 1.0, TP=8's highest rate saturated the emulator on this box)."""
    raw = cfg.get("time_scale")
    if raw is None:
        return 1.0
    try:
        scale = float(raw)
    except (TypeError, ValueError):
        scale = math.nan
    if not math.isfinite(scale) or scale <= 0:
        raise InputError(
            None,
            "labs_lab_engine_env.tp_scaling.ENGINESIM_TIME_SCALE",
            f"got {raw!r}, expected a fixed time scale > 0 (the sweep's rates are divided by it; 'auto' "
            "would change it between runs)",
        )
    return scale


def plan(r: Any, w: dict[str, Any], where: str) -> None:
    isl, osl, n, c = (_int(w, k, where) for k in ("isl", "osl", "num_prompts", "concurrency"))
    rates = w.get("rates")
    if not isinstance(rates, list) or not rates:
        raise InputError(None, f"{where}.rates", f"got {rates!r}, expected a non-empty list of request rates")
    seen = set()
    for rate in rates:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise InputError(None, f"{where}.rates", f"got {rate!r}, expected request rates > 0 (req/s)")
        if rate in seen:
            raise InputError(None, f"{where}.rates", f"{rate!r} appears twice")
        seen.add(rate)
    data = random_dataset(isl, osl)
    profile = w.get("profile", True)
    if not isinstance(profile, bool):
        raise InputError(None, f"{where}.profile", f"got {profile!r}, expected true or false")
    top = max(rates)
    scale = time_scale(r.cfg)
    for rate in sorted(rates):
        wl = {"isl": isl, "osl": osl, "concurrency": c, "num_prompts": n, "warmup": 0, "request_rate": rate}
        if scale != 1.0:
            wl["wall_request_rate"] = rate / scale  # what the client offers in wall seconds
        # the engine's profiler traces the highest rate: the busiest forward passes of the sweep
        r.add(
            rate_name(rate),
            wl,
            data,
            request_rate=f"{rate / scale:g}",
            expect_output_len=osl,
            profile=profile and rate == top,
        )
