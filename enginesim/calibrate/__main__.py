"""python -m enginesim.calibrate --out DIR: measure this GPU (or, tiny, a CPU); write profile.json + raw.json.

Why sections are written as they finish: a device lease or a node can go away mid-run; what was
measured by then is kept (raw.json is rewritten atomically after every section) and says what failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any

from .. import catalog

SECTIONS = ("bandwidth", "gemm", "attention", "launch", "model")
RAW_SCHEMA = "enginesim.calibration-raw/1"
DEFAULT_STEP_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_GEMM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m enginesim.calibrate", description=__doc__)
    p.add_argument("--out", required=True, help="directory for profile.json and raw.json (created)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--base", default=None, help="hardware.json profile for datasheet and unmeasured fields")
    p.add_argument("--key", default=None, help="key of the written profile (default <base>-measured)")
    p.add_argument("--model", default=DEFAULT_STEP_MODEL, help="dense catalogue model for whole steps")
    p.add_argument("--gemm-model", default=DEFAULT_GEMM_MODEL, help="dense catalogue model for GEMM shapes")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a health check)")
    ns = p.parse_args(argv)
    sections = [s for s in ns.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        p.error(f"--sections {ns.sections!r}: must be a comma list of {', '.join(SECTIONS)}")
    ns.sections = sections
    if ns.base is not None and ns.base not in catalog.hardware_keys():
        p.error(f"--base {ns.base!r}: must be one of {', '.join(catalog.hardware_keys())}")
    if ns.gpu < 0:
        p.error(f"--gpu {ns.gpu}: must be >= 0")
    if ns.key is not None and not ns.key.replace("-", "").replace("_", "").replace(".", "").isalnum():
        p.error(f"--key {ns.key!r}: must be letters, digits, '-', '_' or '.'")
    for path in ("profile.json", "raw.json"):
        if os.path.exists(os.path.join(ns.out, path)):
            p.error(f"--out {ns.out!r}: {path} already exists there (results are never overwritten)")
    return ns


def _nvidia_smi(index: int) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    fields = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
    try:
        r = subprocess.run(
            [exe, f"--id={index}", f"--query-gpu={fields}", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable: {e}"
    return (r.stdout or r.stderr).strip()


def environment(torch: Any, dev: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "device_type": dev.type,
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            {
                "device_name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
                "total_memory_bytes": props.total_memory,
                "l2_cache_bytes": getattr(props, "L2_cache_size", None),
                "nvidia_smi_before": _nvidia_smi(dev.index or 0),
            }
        )
    else:
        env.update(
            {
                "device_name": f"CPU ({platform.processor() or platform.machine()})",
                "threads": torch.get_num_threads(),
                "total_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                "l2_cache_bytes": None,
            }
        )
    return env


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    from . import plan as plans

    try:
        build = plans.gpu_plan if ns.device != "cpu" else plans.cpu_plan
        build(ns.gemm_model, ns.model)
    except (KeyError, ValueError) as e:
        print(f"python -m enginesim.calibrate: error: model: {e}", file=sys.stderr)
        return 2
    import torch

    from . import decoder, kernels, profile

    if ns.device == "cuda" and not torch.cuda.is_available():
        print("python -m enginesim.calibrate: error: --device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    use_cuda = ns.device == "cuda" or (ns.device == "auto" and torch.cuda.is_available())
    if use_cuda and ns.gpu >= torch.cuda.device_count():
        print(
            f"python -m enginesim.calibrate: error: --gpu {ns.gpu}: only {torch.cuda.device_count()} "
            "CUDA device(s)",
            file=sys.stderr,
        )
        return 2
    dev = torch.device("cuda", ns.gpu) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    plan = (plans.gpu_plan if use_cuda else plans.cpu_plan)(ns.gemm_model, ns.model)
    if ns.quick:
        plan = plans.quick(plan)
    env = environment(torch, dev)
    base = ns.base or (profile.base_for(env["device_name"]) if use_cuda else "custom")
    if base is None:
        print(
            f"python -m enginesim.calibrate: error: no datasheet profile matches {env['device_name']!r}: "
            f"pass --base (one of {', '.join(catalog.hardware_keys())})",
            file=sys.stderr,
        )
        return 2
    os.makedirs(ns.out, exist_ok=True)
    torch.manual_seed(0)
    raw: dict[str, Any] = {
        "schema": RAW_SCHEMA,
        "device": dev.type,
        "started_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": ["python", "-m", "enginesim.calibrate", *(sys.argv[1:] if argv is None else argv)],
        "env": env,
        "plan": plan.to_json(),
        "model_omits": decoder.OMITTED,
        "sections": {},
        "section_seconds": {},
        "errors": {},
        "nvidia_smi_after_section": {},
    }
    raw_path = os.path.join(ns.out, "raw.json")
    l2 = env.get("l2_cache_bytes") or (8 << 20)
    try:
        how = kernels.sdpa_gqa(dev)
    except Exception as e:  # recorded; the repeat-K/V path works on every backend
        how = {"backend": "default", "gqa": "repeat_kv", "tried": [f"probe failed: {e!r}"[:300]]}
    raw["attention_path"] = how
    steps = {
        "bandwidth": lambda: kernels.bandwidth(plan, dev),
        "gemm": lambda: kernels.gemm(plan, dev, l2),
        "attention": lambda: kernels.attention(plan, dev, how),
        "launch": lambda: kernels.launch(plan, dev),
        "model": lambda: {
            "decode": decoder.decode_steps(plan, dev, how),
            "prefill": decoder.prefill_steps(plan, dev, how),
        },
    }
    for name in ns.sections:
        t0 = time.perf_counter()
        print(f"[calibrate] {name} ...", flush=True)
        try:
            raw["sections"][name] = steps[name]()
        except Exception as e:  # a failed section is recorded with its traceback; the others still run
            raw["errors"][name] = "".join(traceback.format_exception(e))[-4000:]
            print(f"[calibrate] {name} FAILED: {type(e).__name__}: {e}", flush=True)
        raw["section_seconds"][name] = round(time.perf_counter() - t0, 3)
        if use_cuda:
            torch.cuda.empty_cache()
            raw["nvidia_smi_after_section"][name] = _nvidia_smi(ns.gpu)
        profile.write_atomic(raw_path, profile.dumps(raw))
    if use_cuda:
        env["nvidia_smi_after"] = _nvidia_smi(ns.gpu)
    raw_text = profile.dumps(raw)
    profile.write_atomic(raw_path, raw_text)
    if not {"bandwidth", "gemm"} <= set(ns.sections):
        print(f"[calibrate] raw.json only: a profile needs the bandwidth and gemm sections ({raw_path})")
        return 1 if raw["errors"] else 0
    try:
        doc = profile.build(raw, base, ns.key)
    except (profile.IncompleteError, ValueError) as e:
        print(f"python -m enginesim.calibrate: error: no profile written: {e}", file=sys.stderr)
        return 1
    doc["raw_sha256"] = profile.sha256(raw_text)
    profile.write_atomic(os.path.join(ns.out, "profile.json"), profile.dumps(doc))
    print(summary_table(raw, doc))
    return 1 if raw["errors"] else 0


def _fmt(v: Any, scale: float, unit: str) -> str:
    return "-" if v is None else f"{v / scale:,.3g} {unit}"


def summary_table(raw: dict[str, Any], doc: dict[str, Any]) -> str:
    """The short table printed last: headline figures and each model step's median."""
    m = doc["measured"]
    lines = [
        f"device: {raw['env'].get('device_name')} ({raw['device']}), plan {raw['plan']['name']}, "
        f"{m['statistic']}",
        f"HBM read {_fmt(m['mem_read_bytes_per_s'], 1e12, 'TB/s')}, "
        f"copy {_fmt(m['mem_copy_bytes_per_s'], 1e12, 'TB/s')}",
        f"GEMM bf16 prefill {_fmt(m['gemm_bf16_prefill_flops_per_s'], 1e12, 'TFLOP/s')}, square "
        f"{_fmt(m['gemm_bf16_square_flops_per_s'], 1e12, 'TFLOP/s')}, fp8 prefill "
        f"{_fmt(m['gemm_fp8_prefill_flops_per_s'], 1e12, 'TFLOP/s')}",
        f"launch eager {_fmt(m['kernel_launch_s'], 1e-6, 'us')}/kernel, graph replay "
        f"{_fmt(m['graph_replay_s'], 1e-6, 'us')}, in-graph {_fmt(m['graph_kernel_s'], 1e-6, 'us')}/kernel",
        f"eff_compute {doc['profile']['eff_compute']:.3f}, eff_memory {doc['profile']['eff_memory']:.3f}",
    ]
    model = raw["sections"].get("model") or {}
    for r in (model.get("decode") or {}).get("rows", []):
        graph = "graph" if r.get("cuda_graph") else "eager"
        lines.append(
            f"decode B={r['batch']:>3} ctx={r['context_per_request']} {graph}: "
            f"{_fmt(r.get('median_s'), 1e-3, 'ms')} {r.get('error', '')}"
        )
    for r in model.get("prefill") or []:
        t = _fmt(r.get("median_s"), 1e-3, "ms")
        lines.append(f"prefill {r['prompt_tokens']} tokens: {t} {r.get('error', '')}")
    for name, err in raw["errors"].items():
        lines.append(f"SECTION {name} FAILED: {err.strip().splitlines()[-1]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
