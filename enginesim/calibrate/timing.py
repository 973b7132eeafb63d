"""Timing of device work: CUDA events on a GPU, the host clock on a CPU, always warm, always a median.

Why: GPU work is asynchronous, so a host clock around a launch measures the launch; events recorded on
the stream measure the device timeline, idle gaps between launches included (what a step costs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summary(samples: list[float]) -> dict[str, Any]:
    """The figures every measurement carries: median (the statistic quoted), spread, count, samples."""
    s = sorted(samples)
    return {
        "statistic": "median",
        "median_s": statistics.median(s),
        "min_s": s[0],
        "max_s": s[-1],
        "p10_s": s[int(0.1 * (len(s) - 1))],
        "p90_s": s[int(0.9 * (len(s) - 1))],
        "runs": len(s),
        "samples_s": s,
    }


def device_times(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int) -> list[float]:
    """Seconds each of `reps` calls of `fn` took on the device, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    if device.type == "cuda":
        pairs = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            pairs.append((a, b))
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) / 1e3 for a, b in pairs]
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def wall_times(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int) -> list[float]:
    """Host seconds of each call including a synchronisation: launch cost + device time + round trip."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out
