"""A minimal decoder layer stack built from a catalogue config with random weights, and its step times.

Why: a whole step shows what single kernels don't (norms, residuals, the many small launches of a
small model, the LM head), and its speed does not depend on the weights' values, so nothing is
downloaded. What it is: embedding, per layer RMSNorm -> fused QKV -> GQA attention over a static KV
cache -> output projection -> RMSNorm -> fused gate/up -> SiLU·up -> down, final RMSNorm, LM head.
What it leaves out (stated with every result): rotary embeddings, Qwen3's per-head q/k norms,
sampling, and every kernel and scheduler of a real engine (paged KV, fused or custom kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from .kernels import causal_attention, decode_attention
from .plan import Dims, Plan
from .timing import device_times, summary, wall_times

BF16 = torch.bfloat16
OMITTED = "no rotary embedding, no per-head q/k norm, no sampling; greedy logits only; plain PyTorch ops"


def _rand(*shape: int, dev: torch.device) -> torch.Tensor:
    return torch.randn(*shape, device=dev, dtype=BF16) * 0.02


class Decoder:
    """Random bf16 weights and a static KV cache of `batch` sequences x `max_len` positions."""

    def __init__(self, d: Dims, batch: int, max_len: int, dev: torch.device, how: dict[str, Any]) -> None:
        self.d = d
        self.how = how
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        self.split = [q, kv, kv]
        self.embed = _rand(d.vocab, d.hidden, dev=dev)
        self.lm_head = self.embed if d.tie_embeddings else _rand(d.vocab, d.hidden, dev=dev)
        self.norm = torch.ones(d.hidden, device=dev, dtype=BF16)
        self.layers = [
            {
                "n1": torch.ones(d.hidden, device=dev, dtype=BF16),
                "qkv": _rand(q + 2 * kv, d.hidden, dev=dev),
                "o": _rand(d.hidden, q, dev=dev),
                "n2": torch.ones(d.hidden, device=dev, dtype=BF16),
                "gate_up": _rand(2 * d.intermediate, d.hidden, dev=dev),
                "down": _rand(d.hidden, d.intermediate, dev=dev),
                "k": torch.randn(batch, d.kv_heads, max_len, d.head_dim, device=dev, dtype=BF16),
                "v": torch.randn(batch, d.kv_heads, max_len, d.head_dim, device=dev, dtype=BF16),
            }
            for _ in range(d.layers)
        ]

    def _mlp(self, x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
        h = F.rms_norm(x, (self.d.hidden,), w["n2"])
        gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w["down"])

    def decode(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """One decode step: tokens [B] at position `pos` of every sequence; logits [B, vocab]."""
        b, d = tokens.shape[0], self.d
        x = F.embedding(tokens, self.embed)
        for w in self.layers:
            h = F.rms_norm(x, (d.hidden,), w["n1"])
            q, k, v = F.linear(h, w["qkv"]).split(self.split, dim=-1)
            w["k"][:b, :, pos] = k.view(b, d.kv_heads, d.head_dim)
            w["v"][:b, :, pos] = v.view(b, d.kv_heads, d.head_dim)
            a = decode_attention(
                q.reshape(b, d.heads, d.head_dim), w["k"][:b, :, : pos + 1], w["v"][:b, :, : pos + 1]
            )
            x = self._mlp(x + F.linear(a, w["o"]), w)
        return F.linear(F.rms_norm(x, (d.hidden,), self.norm), self.lm_head)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """A whole prompt of one sequence, tokens [n], into an empty cache; logits of the last token."""
        n, d = tokens.shape[0], self.d
        x = F.embedding(tokens, self.embed)
        for w in self.layers:
            h = F.rms_norm(x, (d.hidden,), w["n1"])
            q, k, v = F.linear(h, w["qkv"]).split(self.split, dim=-1)
            w["k"][0, :, :n] = k.view(n, d.kv_heads, d.head_dim).transpose(0, 1)
            w["v"][0, :, :n] = v.view(n, d.kv_heads, d.head_dim).transpose(0, 1)
            qh = q.reshape(n, d.heads, d.head_dim).transpose(0, 1).unsqueeze(0)
            a = causal_attention(qh, w["k"][:1, :, :n], w["v"][:1, :, :n], self.how)
            a = a[0].transpose(0, 1).reshape(n, d.heads * d.head_dim)
            x = self._mlp(x + F.linear(a, w["o"]), w)
        return F.linear(F.rms_norm(x[-1:], (d.hidden,), self.norm), self.lm_head)


def capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """fn captured into a CUDA graph, after warm-up on a side stream (as engines capture decode)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def count_kernels(fn: Callable[[], Any], dev: torch.device) -> int | None:
    """Device kernels one eager call launches (torch profiler); None where it cannot tell."""
    if dev.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(dev)
        return sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    except Exception:  # the profiler is optional evidence; its absence must not stop a calibration
        return None


def _timed(
    fn: Callable[[], Any], dev: torch.device, graph: bool, reps: int, warmup: int
) -> tuple[dict[str, Any], bool]:
    """Device-timeline seconds per step (back to back) and, beside them, host seconds per step with a
    synchronisation after each (what a step costs when the host waits for it, as an engine does)."""
    step: Callable[[], Any] = fn
    g = None
    graph_error = None
    if graph and dev.type == "cuda":
        try:
            g = capture(fn)
            step = g.replay
        except RuntimeError as e:  # timed eagerly instead, and the row says why
            graph_error = _error(e)
            torch.cuda.synchronize(dev)
    s = summary(device_times(step, dev, reps, warmup))
    s["wall_synced"] = summary(wall_times(step, dev, reps, 1))
    if graph_error:
        s["graph_error"] = graph_error
    del g
    return s, step is not fn


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def decode_steps(plan: Plan, dev: torch.device, how: dict[str, Any]) -> dict[str, Any]:
    """Decode steps at each batch (CUDA graphs where there are any) and eager at a few batches."""
    d, ctx = plan.model, plan.decode_ctx
    model = Decoder(d, max(plan.decode_batches + plan.eager_batches), ctx + 1, dev, how)
    tokens = torch.randint(0, d.vocab, (max(plan.decode_batches + plan.eager_batches),), device=dev)
    rows: list[dict[str, Any]] = []
    runs = [(b, True) for b in plan.decode_batches] + [(b, False) for b in plan.eager_batches]
    for b, graph in runs:
        row: dict[str, Any] = {"batch": b, "context_per_request": ctx, "cuda_graph_requested": graph}
        try:
            with torch.inference_mode():
                s, used = _timed(partial(model.decode, tokens[:b], ctx), dev, graph, plan.reps, plan.warmup)
        except RuntimeError as e:  # CUDA OOM is a RuntimeError too
            rows.append({**row, "error": _error(e)})
            continue
        rows.append({**row, "cuda_graph": used, **s, "tokens_per_s": b / s["median_s"]})
    with torch.inference_mode():
        kernels = count_kernels(lambda: model.decode(tokens[:1], ctx), dev)
    return {"rows": rows, "kernels_per_step_batch1": kernels}


def prefill_steps(plan: Plan, dev: torch.device, how: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole prompt at each length, with a CUDA graph (eager on a CPU)."""
    d = plan.model
    model = Decoder(d, 1, max(plan.prefill_lens), dev, how)
    rows = []
    reps = max(5, plan.reps // 3) if dev.type == "cuda" else plan.reps
    for n in plan.prefill_lens:
        tokens = torch.randint(0, d.vocab, (n,), device=dev)
        row: dict[str, Any] = {"prompt_tokens": n, "batch": 1}
        try:
            with torch.inference_mode():
                s, used = _timed(lambda t=tokens: model.prefill(t), dev, True, reps, min(plan.warmup, 2))
        except RuntimeError as e:  # CUDA OOM is a RuntimeError too
            rows.append({**row, "error": _error(e)})
            continue
        rows.append({**row, "cuda_graph": used, **s, "tokens_per_s": n / s["median_s"]})
    return rows
