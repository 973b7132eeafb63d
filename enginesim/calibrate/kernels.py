"""Single-kernel measurements: memory bandwidth, GEMM rates, attention, launch overhead.

Why these: they are the inputs of enginesim's roofline (achievable bandwidth and matrix rate as
fractions of the datasheet, per-launch and per-graph-replay costs) at the shapes a served model runs.
Inputs are random (never zeros: a zero matrix product runs faster than real data) and rotated over
copies larger than the L2 cache wherever one copy would fit in it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .plan import Plan
from .timing import device_times, summary, sync, wall_times

BF16 = torch.bfloat16


def _rate(value: float, sec: float) -> float:
    return value / sec if sec > 0 else 0.0


def _copies(one_bytes: int, l2_bytes: int) -> int:
    """How many copies of an operand to rotate over so that the set is 4x the L2 (at most 16)."""
    return max(1, min(16, math.ceil(4 * l2_bytes / max(one_bytes, 1))))


def bandwidth(plan: Plan, dev: torch.device) -> dict[str, Any]:
    """Read bandwidth (reductions over a buffer far larger than L2; the faster of two kernels) and copy
    bandwidth (read + write)."""
    n = plan.bw_bytes // 2
    x = torch.randn(n, device=dev, dtype=BF16)
    as_f32 = x.view(torch.float32)
    reads = {}
    for name, fn in (
        ("x.sum(dtype=float32) over bf16", lambda: x.sum(dtype=torch.float32)),
        ("x.view(float32).sum()", lambda: as_f32.sum()),
    ):
        s = summary(device_times(fn, dev, plan.reps, plan.warmup))
        reads[name] = {**s, "bytes": plan.bw_bytes, "bytes_per_s": _rate(plan.bw_bytes, s["median_s"])}
    best = max(reads, key=lambda k: reads[k]["bytes_per_s"])
    y = torch.empty_like(x)
    copy = summary(device_times(lambda: y.copy_(x), dev, plan.reps, plan.warmup))
    return {
        "buffer_bytes": plan.bw_bytes,
        "read": {**reads[best], "kernel": best},
        "read_kernels": reads,
        "copy": {
            **copy,
            "kernel": "y.copy_(x), bytes read + written",
            "bytes": 2 * plan.bw_bytes,
            "bytes_per_s": _rate(2 * plan.bw_bytes, copy["median_s"]),
        },
    }


def fp8_supported(dev: torch.device) -> tuple[bool, str]:
    """Whether this device has FP8 matrix units (CUDA capability >= 8.9); a CPU is tried, not assumed."""
    if dev.type == "cuda":
        cap = torch.cuda.get_device_capability(dev)
        if cap < (8, 9):
            return False, f"compute capability {cap[0]}.{cap[1]} < 8.9 has no FP8 tensor cores"
        return True, f"compute capability {cap[0]}.{cap[1]}"
    return True, "cpu: tried, see the rows"


def _fp8_operands(m: int, n: int, k: int, dev: torch.device, copies: int) -> list[tuple[Any, ...]]:
    f8 = torch.float8_e4m3fn
    one = torch.ones((), device=dev, dtype=torch.float32)
    out = []
    for _ in range(copies):
        a = torch.randn(m, k, device=dev, dtype=BF16).to(f8)
        w = torch.randn(n, k, device=dev, dtype=BF16).to(f8)
        out.append((a, w.t(), one, one))
    return out


def _rotate(fn: Callable[..., Any], operand_sets: list[tuple[Any, ...]]) -> Callable[[], Any]:
    """A call of `fn` on the next operand set each time (so repeated calls don't hit the L2 cache)."""
    sets = itertools.cycle(operand_sets)

    def call() -> Any:
        return fn(*next(sets))

    return call


def _fp8_linear(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(a, b, sa, sb, out_dtype=BF16)


def gemm(plan: Plan, dev: torch.device, l2_bytes: int) -> list[dict[str, Any]]:
    """y = x·Wᵀ at the decode and prefill token counts of plan.gemm's layers, in bf16 and (if any) fp8."""
    rows: list[dict[str, Any]] = []
    shapes: list[tuple[str, str, int, int, int]] = []
    shapes.append(("square", "square", plan.square, plan.square, plan.square))
    for phase, ms in (("decode", plan.gemm_decode_m), ("prefill", plan.gemm_prefill_m)):
        for m in ms:
            for name, n, k in plan.gemm.gemms():
                shapes.append((phase, name, m, n, k))
    fp8_ok, fp8_why = fp8_supported(dev)
    for phase, name, m, n, k in shapes:
        flops = 2.0 * m * n * k
        for dtype in ("bf16", "fp8_e4m3"):
            esize = 2 if dtype == "bf16" else 1
            nbytes = (m * k + n * k) * esize + m * n * 2
            row: dict[str, Any] = {
                "phase": phase,
                "gemm": name,
                "dtype": dtype,
                "m": m,
                "n": n,
                "k": k,
                "flops": flops,
                "bytes": nbytes,
            }
            if dtype != "bf16" and not fp8_ok:
                rows.append({**row, "skipped": fp8_why})
                continue
            copies = _copies(n * k * esize, l2_bytes)
            try:
                if dtype == "bf16":
                    ops = [
                        (torch.randn(m, k, device=dev, dtype=BF16), torch.randn(n, k, device=dev, dtype=BF16))
                        for _ in range(copies)
                    ]
                    call = _rotate(F.linear, ops)
                else:
                    ops = _fp8_operands(m, n, k, dev, copies)
                    call = _rotate(_fp8_linear, ops)
                s = summary(device_times(call, dev, plan.reps, plan.warmup))
                del ops
            except (RuntimeError, NotImplementedError, TypeError) as e:
                rows.append({**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
                continue
            rows.append(
                {
                    **row,
                    **s,
                    "operand_copies": copies,
                    "flops_per_s": _rate(flops, s["median_s"]),
                    "bytes_per_s": _rate(nbytes, s["median_s"]),
                }
            )
    return rows


def sdpa_gqa(dev: torch.device) -> dict[str, Any]:
    """Which attention path runs a causal GQA prefill here: SDPA with enable_gqa under the first backend
    that accepts it (flash, then memory-efficient, then cuDNN), else K/V repeated to the query heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 64, 64, device=dev, dtype=BF16)
    k = torch.randn(1, 2, 64, 64, device=dev, dtype=BF16)
    tried = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
            sync(dev)
            return {"backend": backend.name, "gqa": "enable_gqa", "tried": tried}
        except RuntimeError as e:
            tried.append(f"{backend.name}: {str(e).splitlines()[0][:200]}")
    return {"backend": "default", "gqa": "repeat_kv", "tried": tried}


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, how: dict[str, Any]) -> torch.Tensor:
    """Causal attention of q [B, Hq, n, d] over k, v [B, Hkv, n, d] by the path `sdpa_gqa` chose."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if how["gqa"] == "enable_gqa":
        with sdpa_kernel([getattr(SDPBackend, how["backend"])]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One new token per sequence, q [B, Hq, d], over the cache k, v [B, Hkv, L, d].

    The query heads that share a KV head are packed as that head's query rows (no mask is needed when
    every cached position is visible), so each KV byte is read once, by any SDPA backend.
    """
    b, hq, d = q.shape
    hkv = k.shape[1]
    out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), k, v)
    return out.reshape(b, hq * d)


def attention(plan: Plan, dev: torch.device, how: dict[str, Any]) -> list[dict[str, Any]]:
    """Decode attention (KV read) and causal prefill attention at each context, per layer."""
    hq, hkv, d = plan.gemm.heads, plan.gemm.kv_heads, plan.gemm.head_dim
    rows = []
    for ctx in plan.attn_contexts:
        b = max(1, plan.attn_decode_tokens // ctx)
        q = torch.randn(b, hq, d, device=dev, dtype=BF16)
        k = torch.randn(b, hkv, ctx, d, device=dev, dtype=BF16)
        v = torch.randn_like(k)
        kv_bytes = 2 * b * hkv * ctx * d * 2
        s = summary(
            device_times(lambda q=q, k=k, v=v: decode_attention(q, k, v), dev, plan.reps, plan.warmup)
        )
        rows.append(
            {
                "phase": "decode",
                "context": ctx,
                "batch": b,
                "heads": hq,
                "kv_heads": hkv,
                "head_dim": d,
                "kv_bytes": kv_bytes,
                **s,
                "bytes_per_s": _rate(kv_bytes, s["median_s"]),
                "path": "SDPA, query heads packed per KV head",
            }
        )
        del q, k, v
        if not plan.attn_prefill:
            continue
        q = torch.randn(1, hq, ctx, d, device=dev, dtype=BF16)
        k = torch.randn(1, hkv, ctx, d, device=dev, dtype=BF16)
        v = torch.randn_like(k)
        flops = 4.0 * hq * d * ctx * ctx / 2
        try:
            timed = device_times(
                lambda q=q, k=k, v=v: causal_attention(q, k, v, how), dev, plan.reps, plan.warmup
            )
            s = summary(timed)
        except RuntimeError as e:
            rows.append({"phase": "prefill", "context": ctx, "error": str(e).splitlines()[0][:300]})
            continue
        finally:
            del q, k, v
        rows.append(
            {
                "phase": "prefill",
                "context": ctx,
                "batch": 1,
                "heads": hq,
                "kv_heads": hkv,
                "head_dim": d,
                "flops": flops,
                **s,
                "flops_per_s": _rate(flops, s["median_s"]),
                "path": f"SDPA causal, {how['gqa']} ({how['backend']})",
            }
        )
    return rows


def launch(plan: Plan, dev: torch.device) -> dict[str, Any]:
    """What a launch costs: many tiny kernels issued eagerly vs the same kernels replayed from a graph.

    eager_per_kernel_s: host seconds per kernel when issuing is the bottleneck (tiny kernels back to
    back); graph_per_kernel_s: device seconds per kernel inside one graph replay (the floor a graph
    cannot remove); graph_replay_s: one replay of a one-kernel graph, host clock, with a sync.
    """
    x = torch.zeros(16, device=dev)
    n = plan.launch_kernels

    def eager() -> None:
        for _ in range(n):
            x.add_(1.0)

    out: dict[str, Any] = {"kernels": n, "kernel": "x.add_(1.0) on 16 floats"}
    e = summary(wall_times(eager, dev, plan.reps, plan.warmup))
    out["eager"] = {**e, "per_kernel_s": e["median_s"] / n}
    out["sync_roundtrip"] = summary(wall_times(lambda: None, dev, plan.reps * 3, plan.warmup))
    if dev.type != "cuda":
        out["graph"] = {"skipped": "CUDA graphs need a CUDA device"}
        return out
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager()
    torch.cuda.current_stream().wait_stream(side)
    g_many = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_many):
        eager()
    g_one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_one):
        x.add_(1.0)
    many_dev = summary(device_times(g_many.replay, dev, plan.reps, plan.warmup))
    many_wall = summary(wall_times(g_many.replay, dev, plan.reps, plan.warmup))
    one_wall = summary(wall_times(g_one.replay, dev, plan.reps * 3, plan.warmup))
    one_dev = summary(device_times(g_one.replay, dev, plan.reps * 3, plan.warmup))
    out["graph"] = {
        "many_device": {**many_dev, "per_kernel_s": many_dev["median_s"] / n},
        "many_wall": many_wall,
        "one_kernel_wall": one_wall,
        "one_kernel_device": one_dev,
    }
    return out
