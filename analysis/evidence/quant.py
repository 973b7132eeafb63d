"""Which quantization method and kernel a server actually ran, from its start-up log; GPU memory from
nvidia-smi; accuracy from an lm_eval results file.

Why from the log: a requested format is not a served format. vLLM and SGLang convert AWQ/GPTQ to
Marlin when the GPU allows, and run FP8 checkpoints as weight-only Marlin (W8A16) on GPUs without FP8
tensor cores, saying so only in a start-up line. A comparison of formats is only honest when each
variant's kernel is read back and a fallback is named as one. Every finding keeps the line it came
from.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM/SGLang (awq_marlin.py, gptq_marlin.py): "The model is convertible to awq_marlin during runtime.
# Using awq_marlin kernel."
_CONVERTIBLE = re.compile(r"The model is convertible to (?P<m>\w+) during runtime\. Using (?P<k>\w+) kernel")
# vLLM (awq_marlin.py): the user forced the plain kernel on a Marlin-capable checkpoint.
_FORCING = re.compile(
    r"Detected that the model can run with (?P<fast>\w+), however you specified quantization=(?P<m>\w+) "
    r"explicitly, so forcing (?P<k>\w+)"
)
# vLLM kernel choice: "Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod",
# "Using MarlinLinearKernel for CompressedTensorsWNA16".
_SELECTED = re.compile(r"(?:Selected|Using) (?P<k>\w+Kernel) for (?P<m>\w+)")
_FP8_CKPT = re.compile(r"Detected fp8 checkpoint")
_FP8_MARLIN = re.compile(r"does not have native support for FP8 computation.*Weight-only FP8 compression")
_FP4_MARLIN = re.compile(r"does not have native support for FP4 computation.*Weight-only FP4 compression")
_FP8_FALLBACK = (
    "FP8 weight-only Marlin (W8A16) instead of an FP8 GEMM (the engine says the GPU has no native FP8)"
)
_FP4_FALLBACK = "FP4 weight-only Marlin instead of an FP4 GEMM (the engine says the GPU has no native FP4)"
_NOT_OPTIMIZED = re.compile(r"(?P<m>\w+) quantization is not fully optimized yet")
# SGLang (2026): "Load weight end. elapsed=7.79 s, type=..., quant=fp8, fmt=e4m3, ..., mem usage=28.49 GB."
_SGL_LOAD = re.compile(r"Load weight end\..*?(?:quant=(?P<q>\w+).*?)?mem usage=(?P<gb>[\d.]+) GB")
# vLLM (gpu_model_runner.py): "Model loading took 18.55 GiB memory and 31.238919 seconds"
_VLLM_LOAD = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB memory")
_QUANT_ERROR = re.compile(
    r"(?:Cannot find the config file for \w+|does not match the quantization method"
    r"|quantization method \w+ is not supported for the current GPU"
    r"|Failed to find a kernel that can implement)"
)


@dataclass
class KernelEvidence:
    """What the log says about the weights' method and kernel (None: the log does not say)."""

    method: str | None = None
    kernel: str | None = None
    fallback: str | None = None  # a slower path replacing the requested one, in the log's words
    slow_path: str | None = None  # a plain (non-Marlin) kernel the user asked for explicitly
    fp8_checkpoint: bool = False
    weight_gib: float | None = None
    errors: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_evidence(log: str) -> KernelEvidence:
    """Scan a start-up log (stream of lines) for the quantization method, kernel and fallback."""
    ev = KernelEvidence()
    for raw in log.splitlines():
        line = _ANSI.sub("", raw)
        hit = False
        if m := _CONVERTIBLE.search(line):
            ev.method, ev.kernel, hit = m["m"], m["k"], True
        if m := _FORCING.search(line):
            ev.method, ev.kernel, hit = m["m"], m["k"], True
            ev.slow_path = f"{m['k']} forced instead of {m['fast']} (quantization={m['m']} given explicitly)"
        if m := _SELECTED.search(line):
            ev.kernel, hit = m["k"], True
            if "Fp8" in m["m"] and ev.method is None:
                ev.method = "fp8"
        if _FP8_CKPT.search(line):
            ev.fp8_checkpoint, hit = True, True
            ev.method = ev.method or "fp8"
        if _FP8_MARLIN.search(line):
            ev.fallback = _FP8_FALLBACK
            ev.method = ev.method or "fp8"
            if ev.kernel is None or "Marlin" not in ev.kernel:
                ev.kernel = "fp8_marlin (weight-only)"
            hit = True
        if _FP4_MARLIN.search(line):
            ev.fallback, hit = (
                "FP4 weight-only Marlin instead of an FP4 GEMM (the engine says the GPU has no native FP4)",
                True,
            )
        if m := _NOT_OPTIMIZED.search(line):
            ev.slow_path = ev.slow_path or f"{m['m']} runs a kernel the engine calls not fully optimized"
            hit = True
        if m := _SGL_LOAD.search(line):
            ev.weight_gib = float(m["gb"])  # SGLang divides by 2**30 and prints "GB"
            if m["q"]:
                ev.method = ev.method or m["q"]
            hit = True
        if m := _VLLM_LOAD.search(line):
            ev.weight_gib, hit = float(m["gib"]), True
        if _QUANT_ERROR.search(line):
            ev.errors.append(line.strip())
            hit = True
        if hit:
            ev.lines.append(line.strip())
    return ev


def served_format(requested: str | None, checkpoint_hint: str, ev: KernelEvidence) -> dict[str, Any]:
    """Whether the variant served the format it asked for, from the kernel evidence alone.

    ``requested``: the --quantization value (None: not passed); ``checkpoint_hint``: the variant's
    format name in the lab (bf16, fp8, awq_int4, ...). A fallback or an unproven kernel is never
    "as requested".
    """
    if ev.errors:
        return {"status": "refused", "why": ev.errors[0]}
    if ev.fallback:
        return {"status": "fallback", "why": ev.fallback}
    if requested is None and checkpoint_hint in ("bf16", "fp16"):
        if ev.method:
            return {"status": "unexpected", "why": f"an unquantized variant logged method {ev.method}"}
        return {"status": "as requested", "why": "no quantization requested and none logged"}
    family = (requested or checkpoint_hint).removesuffix("_marlin").split("_")[0]
    if ev.method is None:
        return {"status": "unproven", "why": "the log names no quantization method"}
    if not ev.method.startswith(family):
        return {
            "status": "unexpected",
            "why": f"requested {requested or checkpoint_hint}, log says {ev.method}",
        }
    if ev.slow_path:
        return {"status": "as requested (slow kernel)", "why": ev.slow_path}
    if ev.kernel is None and family != "fp8":
        return {"status": "unproven", "why": f"method {ev.method} logged, but no kernel named"}
    return {
        "status": "as requested",
        "why": f"method {ev.method}, kernel {ev.kernel or 'native FP8 (no fallback line)'}",
    }


def gpu_memory(csv_text: str) -> list[dict[str, Any]]:
    """nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader,nounits rows."""
    out = []
    for row in csv.reader(io.StringIO(csv_text)):
        cells = [c.strip() for c in row]
        if len(cells) != 4:
            continue
        try:
            out.append(
                {
                    "index": int(cells[0]),
                    "name": cells[1],
                    "used_mib": float(cells[2]),
                    "total_mib": float(cells[3]),
                }
            )
        except ValueError:
            continue
    return out


# Metric key lm_eval writes per task (results[task]["<metric>,<filter>"]), the one the lab reports.
_EVAL_METRICS = ("word_perplexity", "acc_norm", "acc", "exact_match")


def lm_eval_scores(doc: Any) -> dict[str, dict[str, Any]]:
    """task -> {metric, value, stderr} from an lm_eval results JSON (its `results` mapping)."""
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for task, vals in results.items():
        if not isinstance(vals, dict):
            continue
        for metric in _EVAL_METRICS:
            key = next((k for k in vals if k.split(",")[0] == metric), None)
            if key is None:
                continue
            value = vals[key]
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue
            filt = key.split(",", 1)[1] if "," in key else "none"
            stderr = vals.get(f"{metric}_stderr,{filt}")
            out[task] = {
                "metric": metric,
                "value": float(value),
                "stderr": float(stderr) if isinstance(stderr, int | float) else None,
            }
            break
    return out
