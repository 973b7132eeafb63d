"""Scheduler CPU time, forward time and their overlap, from an engine profiler trace.

Why: an engine that schedules step n+1 on the CPU while step n runs on the GPU (SGLang's overlap
scheduler, vLLM's async scheduling) hides the scheduler's cost; one that does not adds it to every
step. The trace shows which: the scheduler's CPU spans and the forward pass's GPU kernels, and the
time both run at once. Real torch-profiler traces (with Python stacks) name the scheduler functions;
enginesim's trace has one span per step with the same function name on a track of its own. The trace
file is read by `analysis.evidence.trace` (tp_scaling's reader); everything here is interval
arithmetic on numpy arrays.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# The scheduling functions whose CPU spans count as the scheduler, per engine (their Python stack
# events: `<file>(<line>): <function>` in torch traces, `Class.function` in enginesim's).
SCHED_SPANS = {
    "sglang": re.compile(r"(get_next_batch_to_run|get_new_batch_prefill|update_running_batch)$"),
    "vllm": re.compile(r"(Scheduler\.schedule|sched/scheduler\.py\(\d+\): schedule)$"),
}


def merge(spans: np.ndarray) -> np.ndarray:
    """Disjoint, sorted intervals covering the same time as ``spans`` (n x 2: start, end)."""
    if len(spans) == 0:
        return np.zeros((0, 2))
    arr = spans[np.argsort(spans[:, 0])]
    ends = np.maximum.accumulate(arr[:, 1])
    new_block = np.concatenate(([True], arr[1:, 0] > ends[:-1]))
    block_id = np.cumsum(new_block) - 1
    out = np.zeros((int(block_id[-1]) + 1, 2))
    out[:, 0] = arr[new_block, 0]
    np.maximum.at(out[:, 1], block_id, arr[:, 1])
    return out


def covered(spans: np.ndarray) -> float:
    return float(np.sum(spans[:, 1] - spans[:, 0])) if len(spans) else 0.0


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Time covered by both sets of disjoint intervals (a sweep over their boundaries)."""
    if len(a) == 0 or len(b) == 0:
        return 0.0
    times = np.concatenate((a[:, 0], a[:, 1], b[:, 0], b[:, 1]))
    delta_a = np.concatenate((np.ones(len(a)), -np.ones(len(a)), np.zeros(2 * len(b))))
    delta_b = np.concatenate((np.zeros(2 * len(a)), np.ones(len(b)), -np.ones(len(b))))
    order = np.lexsort((delta_a + delta_b, times))  # at one instant, ends before starts
    t, in_a, in_b = times[order], np.cumsum(delta_a[order]), np.cumsum(delta_b[order])
    both = (in_a[:-1] > 0) & (in_b[:-1] > 0)
    return float(np.sum(np.diff(t)[both]))


def _spans(events: list[Any], keep: Any) -> np.ndarray:
    rows = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or not keep(ev):
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        if dur > 0:
            rows.append((ts, ts + dur))
    return np.array(rows, dtype=float).reshape(-1, 2)


def analyse(doc: dict[str, Any], engine: str) -> dict[str, Any]:
    """Scheduler CPU µs, forward (GPU kernel) µs, overlap µs and shares over the traced window."""
    events = doc["traceEvents"]
    rx = SCHED_SPANS[engine]
    sched = merge(_spans(events, lambda e: e.get("cat") != "kernel" and rx.search(str(e.get("name", "")))))
    fwd = merge(_spans(events, lambda e: e.get("cat") == "kernel"))
    emulated = any(isinstance(e, dict) and (e.get("args") or {}).get("enginesim") for e in events[:50])
    both = np.concatenate((sched, fwd)) if len(sched) + len(fwd) else np.zeros((0, 2))
    window = float(both[:, 1].max() - both[:, 0].min()) if len(both) else 0.0
    s_us, f_us, o_us = covered(sched), covered(fwd), overlap(sched, fwd)
    return {
        "sched_cpu_us": round(s_us, 3),
        "forward_us": round(f_us, 3),
        "overlap_us": round(o_us, 3),
        "window_us": round(window, 3),
        "sched_spans": len(sched),
        "forward_blocks": len(fwd),
        "overlap_of_sched": round(o_us / s_us, 4) if s_us > 0 else None,
        "sched_share_of_window": round(s_us / window, 4) if window > 0 else None,
        "forward_share_of_window": round(f_us / window, 4) if window > 0 else None,
        "sched_pattern": rx.pattern,
        "emulated": bool(emulated),
    }
