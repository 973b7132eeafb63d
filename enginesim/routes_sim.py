"""The emulator's own surface: POST /enginesim/pace (choose the next case's time scale from its replay
and a box probe; enginesim/README.md, Pacing). No real engine has this path.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from typing import Any

from . import capacity, pacing, replay
from .httpserver import Conn, Request, Response
from .wire import ApiError, dumps


def _pace_workload(obj: dict[str, Any]) -> list[str]:
    """The replay flags of a pace request: {isl, osl, num_prompts, concurrency?, request_rate?, seed?}."""
    args: list[str] = []
    for key, required in (("isl", True), ("osl", True), ("num_prompts", True), ("concurrency", False)):
        v = obj.get(key)
        if v is None and not required:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ApiError(400, f"{key} must be an integer >= 1, got {v!r}")
        args += [f"--{key.replace('_', '-')}", str(v)]
    rate = obj.get("request_rate")
    if rate is not None and str(rate).strip().lower() != "inf":
        try:
            value = float(rate)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(rate, bool) or not 0 < value < math.inf:
            raise ApiError(400, f"request_rate must be a number > 0 or 'inf', got {rate!r}")
        args += ["--request-rate", repr(value)]
    seed = obj.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ApiError(400, f"seed must be an integer, got {seed!r}")
    args += ["--seed", str(seed)]
    return args


class SimRoutes:
    """Mixed into api.App."""

    async def pace(self, req: Request, conn: Conn) -> Response:
        """Choose and apply the time scale for the next case from its replay and a box calibration."""
        obj = self.body(req)
        w = _pace_workload(obj)
        backend = obj.get("backend", self.fl.name)
        if not isinstance(backend, str):
            raise ApiError(400, f"backend must be a string, got {backend!r}")
        e = self.e
        out: dict[str, Any] = {"applied": False, "time_scale": e.scale, "auto": self.cfg.sim.auto_scale}
        if not self.cfg.sim.auto_scale:
            out["reason"] = "the time scale is pinned by --sim-time-scale / ENGINESIM_TIME_SCALE"
            return Response(200, dumps(out))
        if not e.idle():
            out["reason"] = "requests are running: a case keeps one time scale"
            return Response(200, dumps(out))
        try:
            replayed = await self._replay(w)
        except RuntimeError as ex:
            raise ApiError(400, f"replay failed: {ex}") from None
        box = pacing.calibrate()
        # a closed-loop client sends its first `concurrency` requests at once (all of them at rate inf)
        burst = min(int(obj.get("concurrency") or obj["num_prompts"]), int(obj["num_prompts"]))
        profile = replayed["enginesim_replay"]
        cap = self.cfg.sim.pace_max_case_s
        scale, why = pacing.choose_scale(profile, box, backend, cap, burst, int(obj["isl"]))
        if not e.set_scale(scale):
            out["reason"] = "requests arrived meanwhile: a case keeps one time scale"
            return Response(200, dumps(out))
        out.update(why)
        out["applied"] = True
        out["replay"] = {k: v for k, v in replayed.items() if k.endswith("_ms") or k.endswith("_throughput")}
        out["replay_profile"] = replayed["enginesim_replay"]
        e.log.info(
            f"enginesim: time scale {scale} for the next case (set by {why['set_by']}; needs {why['needs']}; "
            f"box {why['box']})",
            rank=False,
        )
        return Response(200, dumps(out))

    async def _replay(self, w: list[str]) -> dict[str, Any]:
        """The case's replay, in this process (a thread; the server is idle while it paces): a replay
        process per case cost ~0.28 s of interpreter start and imports inside every case's set-up."""
        key = tuple(w)
        hit = self.replays.get(key)
        if hit is not None:
            return hit
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(None, _run_replay, [*self.cfg.argv, *w])
        self.replays[key] = res
        return res


def _run_replay(argv: list[str]) -> dict[str, Any]:
    """`python -m enginesim replay <argv>`'s JSON object, or RuntimeError with its message."""
    t0 = time.perf_counter()
    try:
        cfg, w = replay.parse(argv)
        res = replay.run(cfg, w)
    except SystemExit as e:  # argparse refused a flag (its message went to stderr)
        raise RuntimeError(f"the replay refused its flags (exit {e.code})") from None
    except (capacity.StartupOOM, ValueError, RuntimeError) as e:
        raise RuntimeError(str(e)) from None
    res["enginesim_replay"]["replay_wall_s"] = round(time.perf_counter() - t0, 3)
    out = json.loads(json.dumps(res))
    del res
    gc.collect()  # the replay's garbage goes now, not in a collection during the case it paces
    return out  # the same plain values (NaN kept) the replay command prints
