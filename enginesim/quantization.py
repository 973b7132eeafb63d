"""Weight quantization: which checkpoint format a model is in, which kernel the emulated GPU runs it
with, what that costs, and the start-up lines the real engines print about it.

Why a module of its own: a quantization comparison is only believable when the engine says which
kernel it actually used. The real engines pick a kernel per GPU architecture (FP8 GEMMs need sm_89 or
newer, Marlin needs sm_80 or newer) and fall back to a slower path with a warning when the fast one is
missing; the emulator does the same, prints the same lines, and never upgrades a fallback silently.
Refusals (a method the checkpoint does not hold, a kernel the GPU cannot run) are the engines' own
start-up errors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import Any

from . import catalog

# Bytes one linear-layer parameter occupies, with its scales: FP8 per-channel scales are negligible;
# INT4 with group 128 carries an FP16 scale and a 4-bit zero point per 128 weights.
BF16_BYTES = 2.0
FP8_BYTES = 1.0
INT4_G128_BYTES = 0.5 + 2 / 128 + 0.5 / 128

# Compute capability of each hardware profile (the datasheets' SM version).
_SM_BY_KEY = {
    "h200": 90,
    "h100": 90,
    "a100-80g": 80,
    "rtx-pro-6000-server": 120,
    "rtx-pro-6000d": 120,
    "custom": 89,
}
_SM_BY_NAME = (("H200", 90), ("H100", 90), ("A100", 80), ("L40S", 89), ("RTX PRO 6000", 120))

FP8_NATIVE_MIN_SM = 89
MARLIN_MIN_SM = 80

# Time of the linear layers' FLOPs relative to BF16 dense tensor cores (emulator assumptions, written
# out in the README): FP8 tensor cores run at twice the BF16 rate; Marlin dequantizes inside a BF16
# GEMM; the plain AWQ/GPTQ GEMM kernels reach about a third of it.
COMPUTE_FACTOR = {
    "bf16": 1.0,
    "fp8_native": 0.5,
    "fp8_marlin": 1.0,
    "marlin_int4": 1.0,
    "awq_gemm": 3.0,
    "gptq_exllama": 3.0,
}

# The two engines' real switches that force the FP8 weight-only Marlin path on any GPU.
FORCE_FP8_MARLIN_ENV = {"sglang": "SGLANG_FORCE_FP8_MARLIN", "vllm": "VLLM_TEST_FORCE_FP8_MARLIN"}

_FP8_MARLIN_WARNING = (
    "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
    "Weight-only FP8 compression will be used leveraging the Marlin kernel. This may degrade performance "
    "for compute-heavy workloads."
)


class QuantError(ValueError):
    """The engine refuses the combination at start-up (its own error text)."""


@dataclass(frozen=True)
class Line:
    level: str  # INFO / WARNING
    src: str  # vLLM's "[file.py:NN]"
    text: str


@dataclass(frozen=True)
class Selection:
    """What the engine ends up running: the requested and effective method and the kernel."""

    requested: str | None
    checkpoint: str | None
    method: str | None  # effective method (None = unquantized)
    kernel: str  # "bf16" or a COMPUTE_FACTOR key
    fallback: bool
    bytes_per_param: float
    lines: tuple[Line, ...] = ()


@dataclass
class QuantizedModel(catalog.ModelSpec):
    """A ModelSpec whose linear layers are stored (and priced) in a quantized format."""

    weight_bytes_total: float = 0.0
    selection: Selection | None = field(default=None, compare=False)

    def weight_bytes_per_gpu(self, tp: int) -> float:
        return self.weight_bytes_total / tp


def _checkpoints() -> dict[str, Any]:
    text = resources.files("enginesim").joinpath("data", "quantized.json").read_text()
    return json.loads(text)["checkpoints"]


def load_checkpoint(path_or_name: str) -> catalog.ModelSpec:
    """The model's shapes plus the `quantization_config` its checkpoint declares (extra), if any.

    A directory's config.json says it itself; a known quantized checkpoint name (data/quantized.json)
    takes its base model's shapes. Raises KeyError for an unknown name, as catalog.load_model does.
    """
    cfg_path = os.path.join(path_or_name, "config.json")
    if os.path.isdir(path_or_name) and os.path.isfile(cfg_path):
        model = catalog.load_model(path_or_name)
        with open(cfg_path) as f:
            qc = json.load(f).get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method"):
            model.extra["quantization_config"] = {
                "quant_method": str(qc["quant_method"]).lower(),
                "bits": int(qc.get("bits", 8 if "fp8" in str(qc["quant_method"]) else 4)),
                "group_size": int(qc.get("group_size", 128) or 0),
            }
        return model
    known = _checkpoints()
    if path_or_name in known:
        entry = known[path_or_name]
        model = catalog.load_model(entry["base"])
        model.name = path_or_name
        model.extra["quantization_config"] = {k: entry[k] for k in ("quant_method", "bits", "group_size")}
        return model
    return catalog.load_model(path_or_name)


def capability(hw: catalog.Hardware) -> int | None:
    """The SM version of the emulated GPU (None when the profile names no known GPU)."""
    if hw.key in _SM_BY_KEY:
        return _SM_BY_KEY[hw.key]
    for needle, sm in _SM_BY_NAME:
        if needle in hw.name:
            return sm
    return None


def _marlin(
    method: str, sm: int, flavour: str, explicit_plain: bool, bpp: float, req: str | None
) -> Selection:
    """AWQ/GPTQ INT4: Marlin where the GPU has it, the plain GEMM when the user forces the plain method."""
    marlin = f"{method}_marlin"
    if explicit_plain and sm >= MARLIN_MIN_SM:
        plain_kernel = "awq_gemm" if method == "awq" else "gptq_exllama"
        return Selection(
            req,
            method,
            method,
            plain_kernel,
            False,
            bpp,
            (
                Line(
                    "INFO",
                    f"{marlin}.py:120",
                    f"Detected that the model can run with {marlin}, however you specified "
                    f"quantization={method} explicitly, so forcing {method}. Use quantization={marlin} "
                    "for faster inference",
                ),
                Line(
                    "WARNING",
                    "config.py:931",
                    f"{method} quantization is not fully optimized yet. The speed can be slower than "
                    "non-quantized models.",
                ),
            ),
        )
    if sm < MARLIN_MIN_SM:
        if explicit_plain:
            kernel = "awq_gemm" if method == "awq" else "gptq_exllama"
            return Selection(req, method, method, kernel, False, bpp)
        raise QuantError(
            f"ValueError: The quantization method {marlin} is not supported for the current GPU. "
            f"Minimum capability: {MARLIN_MIN_SM}. Current capability: {sm}."
        )
    del flavour
    return Selection(
        req,
        method,
        marlin,
        "marlin_int4",
        False,
        bpp,
        (
            Line(
                "INFO",
                f"{marlin}.py:162",
                f"The model is convertible to {marlin} during runtime. Using {marlin} kernel.",
            ),
        ),
    )


def select(
    requested: str | None,
    checkpoint: dict[str, Any] | None,
    sm: int | None,
    flavour: str,
    env: dict[str, str],
) -> Selection:
    """Pure: the kernel the engine runs for a requested method, a checkpoint format and a GPU."""
    req = requested.lower() if requested else None
    ckpt = checkpoint["quant_method"] if checkpoint else None
    sm_known = sm if sm is not None else 0
    if req is None and ckpt is None:
        return Selection(None, None, None, "bf16", False, BF16_BYTES)
    family = (req or ckpt or "").removesuffix("_marlin")
    if ckpt is None and family != "fp8":
        raise QuantError(f"ValueError: Cannot find the config file for {req}")
    if ckpt is not None and req is not None and family != ckpt:
        raise QuantError(
            f"ValueError: Quantization method specified in the model config ({ckpt}) does not match the "
            f"quantization method specified in the `quantization` argument ({req})."
        )
    if family in ("awq", "gptq"):
        bits = int(checkpoint.get("bits", 4)) if checkpoint else 4
        bpp = INT4_G128_BYTES if bits == 4 else 1.0 + 2 / 128
        return _marlin(family, sm_known, flavour, req == family, bpp, req)
    if family != "fp8":
        raise QuantError(
            f"ValueError: enginesim emulates the quantization methods fp8, awq, awq_marlin, gptq and "
            f"gptq_marlin; got {req or ckpt!r}"
        )
    detected = Line(
        "WARNING",
        "fp8.py:53",
        "Detected fp8 checkpoint. Please note that the format is experimental and subject to change.",
    )
    head: tuple[Line, ...] = (detected,) if ckpt == "fp8" else ()
    forced = env.get(FORCE_FP8_MARLIN_ENV[flavour], "").lower() in ("1", "true", "yes")
    if sm_known >= FP8_NATIVE_MIN_SM and not forced:
        sel = Line("INFO", "__init__.py:634", "Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod")
        lines = head + ((sel,) if flavour == "vllm" else ())
        return Selection(req, ckpt, "fp8", "fp8_native", False, FP8_BYTES, lines)
    if sm_known >= MARLIN_MIN_SM:
        lines = head
        if flavour == "vllm":
            lines += (
                Line("INFO", "__init__.py:634", "Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"),
            )
        lines += (Line("WARNING", "marlin_utils_fp8.py:111", _FP8_MARLIN_WARNING),)
        return Selection(req, ckpt, "fp8", "fp8_marlin", True, FP8_BYTES, lines)
    raise QuantError(
        f"ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: "
        f"{MARLIN_MIN_SM}. Current capability: {sm_known}."
    )


def apply(
    model: catalog.ModelSpec, requested: str | None, hw: catalog.Hardware, flavour: str, env: dict[str, str]
) -> catalog.ModelSpec:
    """The model as the engine serves it: quantized weight bytes and linear cost, and its selection."""
    sel = select(requested, model.extra.get("quantization_config"), capability(hw), flavour, env)
    if sel.method is None:
        return model
    unquantized = float(model.vocab * model.hidden)  # embeddings stay in the activation dtype
    linear = max(model.total_params - unquantized, 0.0)
    weight_bytes = linear * sel.bytes_per_param + unquantized * model.dtype_bytes
    base = {f.name: getattr(model, f.name) for f in fields(catalog.ModelSpec)}
    base["active_params"] = model.active_params * COMPUTE_FACTOR[sel.kernel]
    base["extra"] = dict(model.extra, quantization=sel.method, quant_kernel=sel.kernel)
    return QuantizedModel(**base, weight_bytes_total=weight_bytes, selection=sel)


def log_lines(model: catalog.ModelSpec) -> tuple[Line, ...]:
    """The start-up lines of the model's kernel selection (none for an unquantized model)."""
    sel = getattr(model, "selection", None)
    return sel.lines if sel is not None else ()
