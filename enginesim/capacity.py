"""KV-cache capacity at start-up, and the start-up lines each engine prints about it.

Why: capacity decides when retraction/preemption starts, and quickmap reads it from the log
(`KV Cache is allocated. #tokens:` / `max_total_num_tokens=` for SGLang; `GPU KV cache size: N tokens`
for vLLM) or from /server_info, so both must agree with the scheduler's real pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import Hardware, ModelSpec
from .cli import Config

GB = 1 << 30


class StartupOOM(Exception):
    """Weights (or the KV pool) do not fit: the real engines die with a CUDA OOM / memory error."""


@dataclass
class Capacity:
    tokens: int  # KV pool size in tokens (vLLM: blocks * block_size)
    kv_bytes_per_token: float
    weight_bytes: float
    kv_bytes: float
    context_len: int
    max_running: int
    blocks: int = 0
    lines: list[str] | None = None


def compute(cfg: Config, model: ModelSpec, hw: Hardware) -> Capacity:
    """Weights that do not fit die alike in both engines (CUDA OOM); the pool is each engine's own."""
    weights = model.weight_bytes_per_gpu(cfg.tp)
    total = hw.mem_bytes
    if weights >= total * 0.98:
        need = weights / GB
        raise StartupOOM(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need - total / GB + 1:.2f} GiB. "
            f"GPU 0 has a total capacity of {total / GB:.2f} GiB of which {0.5:.2f} GiB is free. "
            f"Of the allocated memory {total / GB - 0.5:.2f} GiB is allocated by PyTorch, and 0 bytes is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
    from . import flavours  # each engine sizes its own pool and prints its own lines

    return flavours.get(cfg.flavour).capacity(cfg, model, hw)
