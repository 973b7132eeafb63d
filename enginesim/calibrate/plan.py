"""What to measure: the shapes of one calibration run, on a GPU or (tiny) on a CPU.

Why a plan object: the GPU run and the CPU run (what CI executes) must execute the same code; only the
sizes differ, and the sizes are recorded with every figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .. import catalog


@dataclass(frozen=True)
class Dims:
    """The shapes of a decoder layer stack (from a catalogue entry, or shrunk for a CPU)."""

    model: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    shrunk: bool = False

    def gemms(self) -> list[tuple[str, int, int]]:
        """(name, N out features, K in features) of one layer's linear layers, QKV and gate/up fused."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return [
            ("qkv", q + 2 * kv, self.hidden),
            ("o", self.hidden, q),
            ("gate_up", 2 * self.intermediate, self.hidden),
            ("down", self.hidden, self.intermediate),
        ]


def dims_of(name: str) -> Dims:
    """Shapes of catalogue model `name` (dense decoders only: MoE/MLA entries are refused by name)."""
    m = catalog.load_model(name)
    if m.experts or m.mla:
        raise ValueError(f"model {name!r}: calibrate builds dense GQA decoders only (this one is MoE/MLA)")
    return Dims(
        model=name,
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        kv_heads=m.kv_heads,
        head_dim=m.head_dim,
        intermediate=m.intermediate,
        vocab=m.vocab,
        tie_embeddings=bool(m.extra.get("tie_embeddings", False)),
    )


def tiny(d: Dims) -> Dims:
    """The same structure at sizes a shared 2-core CPU runs in seconds (GQA ratio kept where possible)."""
    group = max(1, d.heads // d.kv_heads)
    kv = 2
    return replace(
        d,
        layers=2,
        hidden=128,
        heads=kv * min(group, 4),
        kv_heads=kv,
        head_dim=32,
        intermediate=256,
        vocab=1024,
        shrunk=True,
    )


@dataclass(frozen=True)
class Plan:
    name: str
    reps: int
    warmup: int
    bw_bytes: int
    gemm: Dims
    gemm_decode_m: tuple[int, ...]
    gemm_prefill_m: tuple[int, ...]
    square: int
    attn_contexts: tuple[int, ...]
    attn_decode_tokens: int
    attn_prefill: bool
    launch_kernels: int
    model: Dims
    decode_batches: tuple[int, ...]
    decode_ctx: int
    eager_batches: tuple[int, ...]
    prefill_lens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def gpu_plan(gemm_model: str, step_model: str) -> Plan:
    return Plan(
        name="gpu",
        reps=30,
        warmup=5,
        bw_bytes=4 << 30,
        gemm=dims_of(gemm_model),
        gemm_decode_m=(1, 8, 32, 64, 128, 256),
        gemm_prefill_m=(4096, 16384),
        square=8192,
        attn_contexts=(1024, 8192, 32768),
        attn_decode_tokens=256 * 1024,
        attn_prefill=True,
        launch_kernels=1000,
        model=dims_of(step_model),
        decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        decode_ctx=1024,
        eager_batches=(1, 64),
        prefill_lens=(4096, 32768),
    )


def cpu_plan(gemm_model: str, step_model: str) -> Plan:
    return Plan(
        name="cpu-tiny",
        reps=5,
        warmup=1,
        bw_bytes=64 << 20,
        gemm=tiny(dims_of(gemm_model)),
        gemm_decode_m=(1, 8),
        gemm_prefill_m=(128,),
        square=256,
        attn_contexts=(128, 256, 512),
        attn_decode_tokens=2048,
        attn_prefill=True,
        launch_kernels=200,
        model=tiny(dims_of(step_model)),
        decode_batches=(1, 4),
        decode_ctx=64,
        eager_batches=(1,),
        prefill_lens=(64, 256),
    )


def quick(p: Plan) -> Plan:
    """A health-check subset: fewer repetitions (sections are chosen separately)."""
    return replace(p, reps=max(3, p.reps // 3), warmup=max(1, p.warmup // 2))
