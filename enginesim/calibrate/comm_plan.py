"""What the collectives measurement sends: TP message sizes from catalogue models, and bus bandwidth.

Why these sizes: in tensor parallelism every layer ends in an all-reduce of the layer's output,
tokens × hidden values (bf16), so a decode step of batch B moves B × hidden × 2 bytes per all-reduce and
a prefill chunk of C tokens moves C × hidden × 2; all-gather appears at the same sizes (sequence-parallel
layers, gathered logits). Pure code: no torch, so it is unit-tested and shared by the CPU and GPU runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .. import catalog

COLLECTIVES = ("all_reduce", "all_gather")
DEFAULT_MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-2-13b-hf", "deepseek-ai/DeepSeek-V3")


@dataclass(frozen=True)
class Message:
    """One measured size. `nbytes` is the collective's full buffer (all-gather: the gathered output)."""

    collective: str
    phase: str  # decode | prefill
    tokens: int
    hidden: int
    models: tuple[str, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class CommPlan:
    name: str
    device: str
    backend: str
    world_sizes: tuple[int, ...]
    decode_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    warmup: int
    samples: int
    inner: int
    messages: tuple[Message, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def hidden_sizes(models: list[str]) -> dict[int, tuple[str, ...]]:
    """hidden size -> the catalogue models that have it (a size shared by two models is measured once)."""
    out: dict[int, list[str]] = {}
    for name in models:
        out.setdefault(catalog.load_model(name).hidden, []).append(name)
    return {h: tuple(names) for h, names in sorted(out.items())}


def messages(
    hiddens: dict[int, tuple[str, ...]],
    decode_tokens: tuple[int, ...],
    prefill_tokens: tuple[int, ...],
    dtype: str = "bf16",
    dtype_bytes: int = 2,
) -> tuple[Message, ...]:
    """Every (collective, hidden, tokens) once, smallest first within each collective."""
    out = []
    for coll in COLLECTIVES:
        for hidden, models in hiddens.items():
            for phase, counts in (("decode", decode_tokens), ("prefill", prefill_tokens)):
                for tokens in counts:
                    out.append(
                        Message(coll, phase, tokens, hidden, models, dtype, tokens * hidden * dtype_bytes)
                    )
    return tuple(sorted(out, key=lambda m: (COLLECTIVES.index(m.collective), m.nbytes, m.hidden)))


def gpu_plan(models: list[str], world_sizes: tuple[int, ...]) -> CommPlan:
    decode, prefill = (1, 8, 32, 64, 128, 256), (2048, 8192)
    return CommPlan(
        name="gpu",
        device="cuda",
        backend="nccl",
        world_sizes=world_sizes,
        decode_tokens=decode,
        prefill_tokens=prefill,
        warmup=5,
        samples=20,
        inner=10,
        messages=messages(hidden_sizes(models), decode, prefill),
    )


def cpu_plan(world_sizes: tuple[int, ...]) -> CommPlan:
    """The same code on a CPU with gloo and tiny sizes (what CI runs): never a GPU figure."""
    decode, prefill = (1, 8), (64,)
    return CommPlan(
        name="cpu-tiny",
        device="cpu",
        backend="gloo",
        world_sizes=world_sizes,
        decode_tokens=decode,
        prefill_tokens=prefill,
        warmup=1,
        samples=5,
        inner=2,
        messages=messages({64: ("tiny (hidden 64)",)}, decode, prefill),
    )


def bus_bandwidth(collective: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s, as nccl-tests defines them.

    algbw = size / time. busbw rescales it to what each link carries, so that it can be compared with
    the hardware's peak whatever the rank count: all-reduce × 2(n-1)/n, all-gather × (n-1)/n, where
    size is the full buffer (for all-gather the gathered output).
    """
    if seconds <= 0 or world < 1:
        raise ValueError(f"seconds={seconds}, world={world}: must be > 0 and >= 1")
    algbw = nbytes / seconds
    factor = {"all_reduce": 2.0 * (world - 1) / world, "all_gather": (world - 1) / world}[collective]
    return algbw, algbw * factor
