"""KV capacity from a server's start-up log, in every form SGLang and vLLM have printed it.

Why from the log: the FP8 KV lab must report the capacity each server announced, not a ratio
assumed from dtype sizes. Each function returns the number and the line it was read from, so a
report can quote its source. Lines may carry ANSI colour codes, rank prefixes, or be printed once
per rank (the first occurrence is taken; ranks of one server announce the same pool).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# SGLang (memory_pool.py): MHA pools print K and V sizes, MLA pools one KV size.
_SGL_KV = re.compile(
    r"KV Cache is allocated\. #tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)
# SGLang (scheduler.py; bench_one_batch prints it bare).
_SGL_MAX = re.compile(r"max_total_num_tokens=(?P<tokens>\d+)")
_SGL_DTYPE = re.compile(r"Using KV cache dtype: (?P<dtype>\S+)")
# vLLM V1 (kv_cache_utils.py): "GPU KV cache size: 840,160 tokens" (also merged with the concurrency).
_VLLM_TOKENS = re.compile(r"GPU KV cache size: (?P<tokens>[\d,]+) tokens")
_VLLM_CONC = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
# vLLM V0 and early V1: "# GPU blocks: N[, # CPU blocks: M]" (device name varies: GPU, CUDA ...).
_VLLM_BLOCKS = re.compile(r"#? ?(?:GPU|CUDA|cuda|\w+) blocks: (?P<blocks>\d+)(?:, # CPU blocks: \d+)?\s*$")
_VLLM_OVERRIDE = re.compile(
    r"Overriding num_gpu_blocks=(?P<was>\d+) with num_gpu_blocks_override=(?P<now>\d+)"
)
# Lines that say FP8 is emulated, refused or not native on this platform (quoted, not interpreted).
_FP8_NOTES = (
    "does not have native support for FP8",
    "not supported in this architecture",
    "Using KV cache scaling factor",
    "Checkpoint does not provide a q scaling factor",
    "fp8 attention",
)


@dataclass
class Capacity:
    """KV capacity one server announced at start."""

    engine: str  # "sglang" or "vllm"
    tokens: int
    line: str
    source: str  # which announcement: kv_allocated | max_total_num_tokens | gpu_kv_cache_size | gpu_blocks
    max_concurrency: float | None = None
    concurrency_len: int | None = None
    blocks_override: int | None = None
    kv_dtype: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in text.splitlines()]


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def sglang_capacity(text: str) -> Capacity | None:
    """SGLang: the KV pool line (#tokens), else the scheduler's max_total_num_tokens."""
    lines = _clean(text)
    dtype = next((m.group("dtype") for ln in lines if (m := _SGL_DTYPE.search(ln))), None)
    for ln in lines:
        m = _SGL_KV.search(ln)
        if m:
            return Capacity("sglang", int(m.group("tokens")), ln.strip(), "kv_allocated", kv_dtype=dtype)
    for ln in lines:
        m = _SGL_MAX.search(ln)
        if m:
            return Capacity(
                "sglang", int(m.group("tokens")), ln.strip(), "max_total_num_tokens", kv_dtype=dtype
            )
    return None


def vllm_capacity(text: str) -> Capacity | None:
    """vLLM: "GPU KV cache size: N tokens" (V1), else "# GPU blocks: N" (V0, no token count: None)."""
    lines = _clean(text)
    conc = next((m for ln in lines if (m := _VLLM_CONC.search(ln))), None)
    override = next((int(m.group("now")) for ln in lines if (m := _VLLM_OVERRIDE.search(ln))), None)
    for ln in lines:
        m = _VLLM_TOKENS.search(ln)
        if m:
            return Capacity(
                "vllm",
                _int(m.group("tokens")),
                ln.strip(),
                "gpu_kv_cache_size",
                max_concurrency=float(conc.group("x")) if conc else None,
                concurrency_len=_int(conc.group("len")) if conc else None,
                blocks_override=override,
            )
    return None


def vllm_blocks(text: str) -> int | None:
    """The V0 / early-V1 block count ("# GPU blocks: N"): blocks, not tokens (block size unknown here)."""
    for ln in _clean(text):
        if "blocks:" in ln and "Overriding" not in ln:
            m = _VLLM_BLOCKS.search(ln)
            if m:
                return int(m.group("blocks"))
    return None


def capacity(text: str, engine: str) -> Capacity | None:
    """The capacity announcement of ``engine`` ("sglang" or "vllm") in a start-up log."""
    return sglang_capacity(text) if engine == "sglang" else vllm_capacity(text)


def fp8_notes(text: str) -> list[str]:
    """Start-up lines about FP8 support on this platform (first of each kind), quoted as written."""
    found: dict[str, str] = {}
    for ln in _clean(text):
        for key in _FP8_NOTES:
            if key in ln and key not in found:
                found[key] = ln.strip()
    return list(found.values())
