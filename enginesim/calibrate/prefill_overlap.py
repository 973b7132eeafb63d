"""Does an eager prefill step cost host launch time plus GPU time, or the larger of the two?

Why: enginesim prices an eager step; the first fixed-cost fit charged every prefill step the eager
host cost per kernel measured on eager *decode* (where the GPU work is tiny, so the host is the whole
step). This script settles the rule on a real GPU with a random-weight Qwen3-0.6B-shaped stack
(28 layers, hidden 1024, 16/8 heads of 128, MLP 3072, tied 151,936 vocabulary): for prompts of 512,
2,048 and 8,192 new tokens, and for 32 and 512 new tokens over a 2,048-token KV prefix, it measures

- `host_launch_s`: host seconds to issue the step, no synchronisation (the CPU side of an eager step);
- `eager_wall_s`: host seconds from issue to the GPU being done (what a step costs an engine that waits);
- `graph_gpu_s`: one CUDA-graph replay of the same kernels, device events (the GPU side, launch gaps gone);
- `compiled_wall_s`: the same step through torch.compile (Inductor fuses the small elementwise ops).

Runs standalone on the device machine: `python3 prefill_overlap.py OUT.json`. Medians of timed runs
after warm-up. What it leaves out: rotary embeddings, paged KV, sampling, an engine's own kernels
(FlashInfer, fused norms) and its scheduler.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 28, 1024, 16, 8, 128, 3072, 151936
BF16 = torch.bfloat16
DEV = torch.device("cuda")
REPS = 30
CASES = [(0, 512), (0, 2048), (0, 8192), (2048, 32), (2048, 512), (2048, 1)]


def _w(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEV, dtype=BF16) * 0.02


class Stack:
    """Random weights and one sequence's KV cache of `max_len` positions per layer."""

    def __init__(self, max_len: int) -> None:
        q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        self.split = [q, kv, kv]
        self.embed = _w(VOCAB, HIDDEN)
        self.layers = [
            {
                "n1": torch.ones(HIDDEN, device=DEV, dtype=BF16),
                "qn": torch.ones(HEAD_DIM, device=DEV, dtype=BF16),
                "kn": torch.ones(HEAD_DIM, device=DEV, dtype=BF16),
                "qkv": _w(q + 2 * kv, HIDDEN),
                "o": _w(HIDDEN, q),
                "n2": torch.ones(HIDDEN, device=DEV, dtype=BF16),
                "gate_up": _w(2 * INTER, HIDDEN),
                "down": _w(HIDDEN, INTER),
                "k": torch.randn(1, KV_HEADS, max_len, HEAD_DIM, device=DEV, dtype=BF16),
                "v": torch.randn(1, KV_HEADS, max_len, HEAD_DIM, device=DEV, dtype=BF16),
            }
            for _ in range(LAYERS)
        ]
        self.norm = torch.ones(HIDDEN, device=DEV, dtype=BF16)


def layer(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: int) -> torch.Tensor:
    """One decoder layer over n new tokens after `prefix` cached ones (causal when there is no prefix;
    with a prefix every new token sees the whole prefix and the new tokens: a few hundred extra
    attention scores, not a different cost)."""
    n = x.shape[0]
    h = F.rms_norm(x, (HIDDEN,), w["n1"])
    q, k, v = F.linear(h, w["qkv"]).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    q = F.rms_norm(q.view(n, HEADS, HEAD_DIM), (HEAD_DIM,), w["qn"])
    k = F.rms_norm(k.view(n, KV_HEADS, HEAD_DIM), (HEAD_DIM,), w["kn"])
    w["k"][0, :, prefix : prefix + n] = k.transpose(0, 1)
    w["v"][0, :, prefix : prefix + n] = v.view(n, KV_HEADS, HEAD_DIM).transpose(0, 1)
    kk = w["k"][:, :, : prefix + n]
    vv = w["v"][:, :, : prefix + n]
    a = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), kk, vv, is_causal=prefix == 0, enable_gqa=True
    )
    x = x + F.linear(a[0].transpose(0, 1).reshape(n, HEADS * HEAD_DIM), w["o"])
    h = F.rms_norm(x, (HIDDEN,), w["n2"])
    gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w["down"])


def forward(s: Stack, tokens: torch.Tensor, prefix: int, lyr: Any = layer) -> torch.Tensor:
    x = F.embedding(tokens, s.embed)
    for w in s.layers:
        x = lyr(x, w, prefix)
    return F.linear(F.rms_norm(x[-1:], (HIDDEN,), s.norm), s.embed)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def host_and_wall(fn: Any) -> tuple[float, float]:
    host, wall = [], []
    for _ in range(REPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
    return med(host), med(wall)


def graph_time(fn: Any) -> tuple[float, float]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    ev = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        ev.append((a, b))
    torch.cuda.synchronize()
    gpu = med([a.elapsed_time(b) / 1e3 for a, b in ev])
    _, wall = host_and_wall(g.replay)
    del g
    return gpu, wall


def kernels(fn: Any) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main(out: str) -> None:
    t_start = time.perf_counter()
    torch.manual_seed(0)
    s = Stack(8192 + 2048)
    compiled_layer = torch.compile(layer, dynamic=False)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for prefix, n in CASES:
            tok = torch.randint(0, VOCAB, (n,), device=DEV)

            def fn(t: torch.Tensor = tok, p: int = prefix) -> torch.Tensor:
                return forward(s, t, p)

            for _ in range(3):
                fn()
            host, wall = host_and_wall(fn)
            gpu, graph_wall = graph_time(fn)
            row: dict[str, Any] = {
                "prefix_tokens": prefix,
                "new_tokens": n,
                "kernels": kernels(fn),
                "host_launch_s": host,
                "eager_wall_s": wall,
                "graph_gpu_s": gpu,
                "graph_wall_s": graph_wall,
            }
            if time.perf_counter() - t_start < 170:
                try:

                    def cfn(t: torch.Tensor = tok, p: int = prefix) -> torch.Tensor:
                        return forward(s, t, p, compiled_layer)

                    for _ in range(3):
                        cfn()
                    row["compiled_kernels"] = kernels(cfn)
                    row["compiled_host_launch_s"], row["compiled_wall_s"] = host_and_wall(cfn)
                except Exception as e:  # compile is optional evidence
                    row["compiled_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items()}), flush=True)
    result = {
        "schema": "enginesim.prefill-overlap/1",
        "what": __doc__.split("\n\n")[0],
        "model_shape": "Qwen3-0.6B (random bf16 weights, tied embeddings, per-head q/k norms, no rotary)",
        "statistic": f"median of {REPS} timed runs after warm-up",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
        "seconds_taken": time.perf_counter() - t_start,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print("prefix   new  kern  host ms eager ms graphGPU  comp ms")
    for r in rows:
        ms = [r["host_launch_s"], r["eager_wall_s"], r["graph_gpu_s"], r.get("compiled_wall_s", 0.0)]
        print(
            f"{r['prefix_tokens']:>6} {r['new_tokens']:>5} {r['kernels']:>5} "
            + " ".join(f"{v * 1e3:8.3f}" for v in ms)
        )


if __name__ == "__main__":
    main(sys.argv[1])
