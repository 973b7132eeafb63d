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
SGLANG_DEFAULT_MEM_FRACTION = 0.836  # the auto value SGLang reports on a 141 GB H200 (2026 /server_info)


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
    tp = cfg.tp
    kv_bpt = model.kv_bytes_per_token(cfg.kv_dtype_bytes, tp)
    weights = model.weight_bytes_per_gpu(tp)
    total = hw.mem_bytes
    ctx = cfg.context_length or model.context
    dtype = "torch.float8_e4m3fn" if model.dtype_bytes == 1 else "torch.bfloat16"
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
    lines: list[str] = []
    if cfg.flavour == "sglang":
        frac = cfg.mem_fraction or SGLANG_DEFAULT_MEM_FRACTION
        avail_after_w = (total - weights) / GB
        lines.append(
            f"Load weight end. type={model.architecture}, dtype={dtype}, "
            f"avail mem={avail_after_w:.2f} GB, mem usage={weights / GB:.2f} GB."
        )
        kv_mem = total * frac - weights
        if kv_mem <= 0:
            raise StartupOOM("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        tokens = int(kv_mem // kv_bpt)
        if cfg.max_total_tokens:
            tokens = min(tokens, cfg.max_total_tokens)
        kv_bytes = tokens * kv_bpt
        if model.mla:
            lines.append(f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv_bytes / GB:.2f} GB")
        else:
            lines.append(
                f"KV Cache is allocated. #tokens: {tokens}, K size: {kv_bytes / 2 / GB:.2f} GB, "
                f"V size: {kv_bytes / 2 / GB:.2f} GB"
            )
        avail_after_kv = (total - weights - kv_bytes) / GB
        lines.append(f"Memory pool end. avail mem={avail_after_kv:.2f} GB")
        pool_reqs = min(max(int(tokens / ctx * 512), 2048), 4096)
        max_running = cfg.max_running or min(max(tokens // 2, 1), pool_reqs)
        chunk = cfg.chunk if cfg.chunk else -1
        lines.append(
            f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, "
            f"max_prefill_tokens={cfg.max_prefill_tokens}, max_running_requests={max_running}, "
            f"context_len={ctx}, available_gpu_mem={max(avail_after_kv - 0.5, 0.01):.2f} GB"
        )
        return Capacity(tokens, kv_bpt, weights, kv_bytes, ctx, max_running, 0, lines)
    # vLLM: util * total - weights - activation peak of a max_num_batched_tokens profile run
    util = cfg.mem_fraction or 0.9
    activation = (cfg.chunk or 8192) * model.hidden * 2 * 12 + 256 * (1 << 20)
    kv_mem = total * util - weights - activation
    block = cfg.page_size
    lines.append(f"Model loading took {weights / GB:.4f} GiB memory and 1.000000 seconds")
    if kv_mem <= 0 and not cfg.num_gpu_blocks_override:
        raise StartupOOM(
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine."
        )
    lines.append(f"Available KV cache memory: {max(kv_mem, 0) / GB:.2f} GiB")
    blocks = int(max(kv_mem, 0) // (kv_bpt * block))
    if cfg.num_gpu_blocks_override:
        lines.append(
            f"Overriding num_gpu_blocks={blocks} with num_gpu_blocks_override={cfg.num_gpu_blocks_override}"
        )
        blocks = cfg.num_gpu_blocks_override
    elif blocks * block < ctx:
        raise StartupOOM(
            f"ValueError: To serve at least one request with the models's max seq len ({ctx}), "
            f"({ctx * kv_bpt / GB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({max(kv_mem, 0) / GB:.2f} GiB). Based on the available memory, the estimated maximum "
            f"model length is {blocks * block}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    tokens = blocks * block
    lines.append(f"GPU KV cache size: {tokens:,} tokens")
    lines.append(f"Maximum concurrency for {ctx:,} tokens per request: {tokens / ctx:.2f}x")
    return Capacity(tokens, kv_bpt, weights, tokens * kv_bpt, ctx, cfg.max_running or 256, blocks, lines)
