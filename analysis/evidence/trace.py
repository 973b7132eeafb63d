"""GPU time of a profiler trace (Chrome/Perfetto JSON, gzipped or not) split into GEMM, attention,
NCCL, other kernels and idle.

Why from the trace: the communication share of a forward pass is what decides TP scaling, and only a
profiler sees it. Real torch-profiler traces (SGLang /start_profile, vLLM's profiler) and enginesim's
trace share the layout read here: complete events (`ph: X`) of category `kernel`, classified by
kernel name. Idle is the part of the window (first kernel start to last kernel end) that no kernel
covers; overlapping kernels (several streams) are merged before it is computed.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.errors import InputError

_NCCL = re.compile(r"nccl|all_?reduce|allgather|reduce_?scatter|cross_device_reduce", re.I)
_ATTN = re.compile(r"flash|fmha|attention|attn|paged|mla|decode_kernel", re.I)
_GEMM = re.compile(r"gemm|gemv|matmul|cutlass|xmma|cublas|marlin|sm\d+_|_mm_|scaled_mm|deep_gemm", re.I)
CATEGORIES = ("gemm", "attention", "nccl", "other", "idle")


@dataclass
class TraceSummary:
    window_us: float
    kernels: int
    gemm_us: float
    attention_us: float
    nccl_us: float
    other_us: float
    idle_us: float
    emulated: bool

    def shares(self) -> dict[str, float | None]:
        w = self.window_us
        return {c: (round(getattr(self, f"{c}_us") / w, 4) if w > 0 else None) for c in CATEGORIES}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"shares": self.shares()}


def classify(name: str) -> str:
    """The category of one kernel name (NCCL first: its kernels' names also say "reduce")."""
    if _NCCL.search(name):
        return "nccl"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "other"


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(path, None, f"not a readable Chrome trace ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(path, "traceEvents", "expected a list of trace events")
    return doc


def summarize(doc: dict[str, Any]) -> TraceSummary:
    """Per-category kernel time and idle of the trace's GPU window."""
    spans: list[tuple[float, float]] = []
    per = dict.fromkeys(CATEGORIES, 0.0)
    emulated = False
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") != "kernel":
            continue
        try:
            ts, dur = float(ev["ts"]), float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        if dur < 0:
            continue
        per[classify(str(ev.get("name", "")))] += dur
        spans.append((ts, ts + dur))
        emulated = emulated or bool((ev.get("args") or {}).get("enginesim"))
    if not spans:
        return TraceSummary(0.0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, emulated)
    arr = np.array(spans)
    arr = arr[np.argsort(arr[:, 0])]
    # union of intervals: a new block starts where a start exceeds every earlier end
    ends = np.maximum.accumulate(arr[:, 1])
    new_block = np.concatenate(([True], arr[1:, 0] > ends[:-1]))
    block_id = np.cumsum(new_block) - 1
    starts = arr[new_block, 0]
    block_ends = np.zeros(len(starts))
    np.maximum.at(block_ends, block_id, arr[:, 1])
    busy = float(np.sum(block_ends - starts))
    window = float(ends[-1] - arr[0, 0])
    return TraceSummary(
        window_us=round(window, 3),
        kernels=len(spans),
        gemm_us=round(per["gemm"], 3),
        attention_us=round(per["attention"], 3),
        nccl_us=round(per["nccl"], 3),
        other_us=round(per["other"], 3),
        idle_us=round(max(window - busy, 0.0), 3),
        emulated=emulated,
    )
