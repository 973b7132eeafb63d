"""Model catalogue and hardware profiles (data files in enginesim/data) and the sizes derived from them.

Why: the cost model and the KV capacity need layer counts, widths and byte sizes; keeping them as data
lets a model directory's config.json stand in for a catalogue entry.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any


def _load(name: str) -> dict[str, Any]:
    return json.loads(resources.files("enginesim").joinpath("data", name).read_text())


@dataclass
class ModelSpec:
    """Shape of a transformer, enough for a roofline and for KV bytes."""

    name: str
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context: int
    total_params: float
    active_params: float
    dtype_bytes: int = 2
    eos_token_id: int = 0
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int) -> float:
        """KV-cache bytes one token occupies on one GPU (MLA latents are replicated over TP)."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        kv_heads_per_gpu = max(1.0, self.kv_heads / tp)
        return 2 * self.layers * kv_heads_per_gpu * self.head_dim * kv_dtype_bytes

    def weight_bytes_per_gpu(self, tp: int) -> float:
        return self.total_params * self.dtype_bytes / tp


def _estimate_params(cfg: dict[str, Any]) -> tuple[float, float]:
    """Parameter count from a Hugging Face config (dense or MoE), ignoring norms and biases."""
    h = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    inter = cfg.get("intermediate_size", 4 * h)
    vocab = cfg.get("vocab_size", 32000)
    attn = h * heads * hd * 2 + 2 * h * kvh * hd
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    emb = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    if experts:
        moe_inter = cfg.get("moe_intermediate_size", inter)
        topk = cfg.get("num_experts_per_tok", 2)
        shared = cfg.get("n_shared_experts", 0)
        mlp_total = 3 * h * moe_inter * (experts + shared)
        mlp_active = 3 * h * moe_inter * (topk + shared)
        return emb + layers * (attn + mlp_total), emb + layers * (attn + mlp_active)
    total = emb + layers * (attn + 3 * h * inter)
    return total, total


def _from_hf_config(name: str, cfg: dict[str, Any]) -> ModelSpec:
    total, active = _estimate_params(cfg)
    heads = cfg["num_attention_heads"]
    torch_dtype = str(cfg.get("torch_dtype", "bfloat16"))
    eos = cfg.get("eos_token_id", 0)
    if isinstance(eos, list):
        eos = eos[0] if eos else 0
    return ModelSpec(
        name=name,
        architecture=(cfg.get("architectures") or ["LlamaForCausalLM"])[0],
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate=cfg.get("intermediate_size", 4 * cfg["hidden_size"]),
        vocab=cfg.get("vocab_size", 32000),
        context=cfg.get("max_position_embeddings", 4096),
        total_params=total,
        active_params=active,
        dtype_bytes=1 if "float8" in torch_dtype else 4 if torch_dtype == "float32" else 2,
        eos_token_id=int(eos),
        mla="kv_lora_rank" in cfg,
        kv_lora_rank=cfg.get("kv_lora_rank") or 0,
        qk_rope_head_dim=cfg.get("qk_rope_head_dim") or 0,
        experts=cfg.get("n_routed_experts") or cfg.get("num_experts") or 0,
        experts_per_token=cfg.get("num_experts_per_tok") or 0,
        moe_intermediate=cfg.get("moe_intermediate_size") or 0,
        extra={"tie_embeddings": bool(cfg.get("tie_word_embeddings", False))},
    )


def catalogue_names() -> list[str]:
    return sorted(_load("models.json")["models"])


def load_model(path_or_name: str) -> ModelSpec:
    """A catalogue entry (exact name, or matched by its last path component) or a dir with config.json."""
    cfg_path = os.path.join(path_or_name, "config.json")
    if os.path.isdir(path_or_name) and os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            return _from_hf_config(path_or_name, json.load(f))
    models = _load("models.json")["models"]
    key = path_or_name
    if key not in models:
        base = path_or_name.rstrip("/").split("/")[-1].lower()
        matches = [k for k in models if k.split("/")[-1].lower() == base]
        if not matches:
            raise KeyError(path_or_name)
        key = matches[0]
    entry = dict(models[key])
    if "alias_of" in entry:
        base_entry = dict(models[entry.pop("alias_of")])
        base_entry.update(entry)
        entry = base_entry
    known = set(ModelSpec.__dataclass_fields__) - {"name", "extra"}
    kwargs = {k: v for k, v in entry.items() if k in known}
    extra = {k: v for k, v in entry.items() if k not in known}
    return ModelSpec(name=path_or_name, extra=extra, **kwargs)


@dataclass
class Hardware:
    """One GPU type: peaks, memory and links, plus the efficiencies and overheads of the model."""

    key: str
    name: str
    peak_flops: float
    mem_bw: float
    mem_bytes: float
    intra_node_bw: float
    inter_node_bw: float
    gpus_per_node: int
    eff_compute: float
    eff_memory: float
    eff_network: float
    overheads: dict[str, float]
    source: str = ""


def hardware_keys() -> list[str]:
    return sorted(_load("hardware.json")["profiles"])


def load_hardware(key: str, override: dict[str, Any] | None = None) -> Hardware:
    """Profile `key` from hardware.json, with optional field overrides (the `custom` entry's knob).

    A measured profile file (hwprofile.read) is applied as an override of `custom` that sets every
    field, its own `key` included.
    """
    data = _load("hardware.json")
    prof = dict(data["profiles"][key])
    if override:
        prof.update(override)
    eff = data["efficiency"]
    return Hardware(
        key=str(prof.get("key", key)),
        name=prof["name"],
        peak_flops=float(prof["peak_flops"]),
        mem_bw=float(prof["mem_bw"]),
        mem_bytes=float(prof["mem_bytes"]),
        intra_node_bw=float(prof["intra_node_bw"]),
        inter_node_bw=float(prof["inter_node_bw"]),
        gpus_per_node=int(prof.get("gpus_per_node", 8)),
        eff_compute=float(prof.get("eff_compute", eff["compute"])),
        eff_memory=float(prof.get("eff_memory", eff["memory"])),
        eff_network=float(prof.get("eff_network", eff["network"])),
        overheads={**data["overheads_s"], **prof.get("overheads_s", {})},
        source=prof.get("source", ""),
    )


def load_engine_costs(flavour: str) -> dict[str, float]:
    """The fixed costs of engine `flavour` (data/engines.json `engines.<name>.costs_s`), seconds.

    Why separate from the hardware profile: scheduler, sampling and request intake are the engine's own
    code on the host, the same on any GPU; a hardware profile (measured or datasheet) never carries them.
    """
    engines = _load("engines.json")["engines"]
    if flavour not in engines:
        raise KeyError(
            f"no engine profile for {flavour!r} in data/engines.json (have: {', '.join(sorted(engines))})"
        )
    return {k: float(v) for k, v in engines[flavour]["costs_s"].items()}
