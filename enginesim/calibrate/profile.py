"""From raw measurements to an enginesim hardware profile (pure), and the files' atomic writes.

Why the split between measured and datasheet fields: a profile must say which numbers came from this
device and which were carried over from the datasheet profile it is based on (links, node size, engine
CPU costs: nothing a one-GPU microbenchmark can see).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from typing import Any

from .. import catalog, hwprofile

# Device-name patterns -> datasheet profile in hardware.json (the first that matches wins).
BASE_BY_NAME = (
    ("H200", "h200"),
    ("H100", "h100"),
    ("A100", "a100-80g"),
    ("RTX PRO 6000 Blackwell Max-Q", "rtx-pro-6000-maxq"),
    ("RTX PRO 6000 Blackwell Server", "rtx-pro-6000-server"),
    ("RTX PRO 6000 Blackwell", "rtx-pro-6000-workstation"),
    ("L40S", "custom"),
)


def base_for(device_name: str) -> str | None:
    """The datasheet profile of a GPU from its name as the driver reports it, if hardware.json has one."""
    for pattern, key in BASE_BY_NAME:
        if pattern.lower() in device_name.lower() and key in catalog.hardware_keys():
            return key
    return None


class IncompleteError(RuntimeError):
    """The raw results lack a figure the profile needs (the section failed or was not run)."""


def _prefill_rate(rows: list[dict[str, Any]], dtype: str) -> tuple[float, int] | None:
    """FLOP/s of one layer's GEMMs at the smallest prefill token count: sum of FLOPs / sum of medians."""
    ok = [r for r in rows if r["phase"] == "prefill" and r["dtype"] == dtype and "median_s" in r]
    if not ok:
        return None
    m = min(r["m"] for r in ok)
    at = [r for r in ok if r["m"] == m]
    return sum(r["flops"] for r in at) / sum(r["median_s"] for r in at), m


def _decode_bytes_rate(rows: list[dict[str, Any]]) -> float | None:
    ok = [
        r for r in rows if r["phase"] == "decode" and r["dtype"] == "bf16" and r["m"] == 1 and "median_s" in r
    ]
    if not ok:
        return None
    return sum(r["bytes"] for r in ok) / sum(r["median_s"] for r in ok)


def measured_figures(raw: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a raw result (each a median; None where not measured)."""
    sec = raw.get("sections", {})
    bw = sec.get("bandwidth") or {}
    gemm = sec.get("gemm") or []
    launch = sec.get("launch") or {}
    pre = _prefill_rate(gemm, "bf16")
    pre8 = _prefill_rate(gemm, "fp8_e4m3")
    square = [r for r in gemm if r["phase"] == "square" and r["dtype"] == "bf16" and "median_s" in r]
    graph = launch.get("graph") or {}
    replay = None
    if "one_kernel_wall" in graph and "sync_roundtrip" in launch:
        replay = max(0.0, graph["one_kernel_wall"]["median_s"] - launch["sync_roundtrip"]["median_s"])
    return {
        "statistic": f"median of {raw.get('plan', {}).get('reps', '?')} timed runs after warm-up",
        "mem_read_bytes_per_s": (bw.get("read") or {}).get("bytes_per_s"),
        "mem_copy_bytes_per_s": (bw.get("copy") or {}).get("bytes_per_s"),
        "gemm_bf16_prefill_flops_per_s": pre[0] if pre else None,
        "gemm_prefill_tokens": pre[1] if pre else None,
        "gemm_fp8_prefill_flops_per_s": pre8[0] if pre8 else None,
        "gemm_bf16_square_flops_per_s": square[0]["flops_per_s"] if square else None,
        "gemm_bf16_decode_m1_bytes_per_s": _decode_bytes_rate(gemm),
        "kernel_launch_s": (launch.get("eager") or {}).get("per_kernel_s"),
        "graph_replay_s": replay,
        "graph_kernel_s": (graph.get("many_device") or {}).get("per_kernel_s"),
    }


def build(raw: dict[str, Any], base_key: str, key: str | None = None) -> dict[str, Any]:
    """The profile document for `raw`, its unmeasured fields (and, on a GPU, its peaks) from `base_key`.

    GPU: peaks stay the datasheet's, efficiencies become measured / datasheet. CPU: there is no
    datasheet, so the measured rates become the peaks at efficiency 1.0; device=cpu marks the file.
    """
    fig = measured_figures(raw)
    if not fig["mem_read_bytes_per_s"] or not fig["gemm_bf16_prefill_flops_per_s"]:
        raise IncompleteError(
            "the profile needs the bandwidth and gemm sections (read bandwidth and bf16 prefill GEMM rate); "
            f"measured: read={fig['mem_read_bytes_per_s']}, gemm={fig['gemm_bf16_prefill_flops_per_s']}"
        )
    base = dataclasses.asdict(catalog.load_hardware(base_key))
    device = raw["device"]
    env = raw.get("env", {})
    ov = dict(base["overheads"])
    measured_fields = ["mem_bytes", "eff_compute", "eff_memory"]
    if fig["kernel_launch_s"] is not None:
        ov["kernel_launch"] = fig["kernel_launch_s"]
        measured_fields.append("overheads_s.kernel_launch")
    if fig["graph_replay_s"] is not None:
        ov["graph_replay"] = fig["graph_replay_s"]
        measured_fields.append("overheads_s.graph_replay")
    if fig["graph_kernel_s"] is not None:
        ov["graph_kernel"] = fig["graph_kernel_s"]
        measured_fields.append("overheads_s.graph_kernel")
    if device == "cuda":
        peak_flops, mem_bw = base["peak_flops"], base["mem_bw"]
        eff_c = fig["gemm_bf16_prefill_flops_per_s"] / peak_flops
        eff_m = fig["mem_read_bytes_per_s"] / mem_bw
    else:
        peak_flops, mem_bw = fig["gemm_bf16_prefill_flops_per_s"], fig["mem_read_bytes_per_s"]
        eff_c = eff_m = 1.0
        measured_fields += ["peak_flops", "mem_bw"]
    prof = {
        "key": key or (f"{base_key}-measured" if device == "cuda" else "cpu-measured"),
        "name": f"{env.get('device_name', device)} (measured)",
        "peak_flops": peak_flops,
        "mem_bw": mem_bw,
        "mem_bytes": float(env.get("total_memory_bytes") or base["mem_bytes"]),
        "intra_node_bw": base["intra_node_bw"],
        "inter_node_bw": base["inter_node_bw"],
        "gpus_per_node": base["gpus_per_node"],
        "eff_compute": eff_c,
        "eff_memory": eff_m,
        "eff_network": base["eff_network"],
        "overheads_s": ov,
        "source": (
            f"python -m enginesim.calibrate on {env.get('device_name', device)} "
            f"at {raw.get('started_utc', '?')} "
            f"(torch {env.get('torch', '?')}, CUDA {env.get('cuda', '-')}); datasheet figures and unmeasured "
            f"fields from hardware.json '{base_key}'"
        ),
    }
    carried = [
        f
        for f in ("peak_flops", "mem_bw", "intra_node_bw", "inter_node_bw", "gpus_per_node", "eff_network")
        if f not in measured_fields
    ] + [f"overheads_s.{k}" for k in ov if f"overheads_s.{k}" not in measured_fields]
    doc = {
        "schema": hwprofile.SCHEMA,
        "device": device,
        "profile": prof,
        "measured": fig,
        "measured_fields": measured_fields,
        "from_base": {"profile": base_key, "fields": carried},
        "environment": env,
        "raw_file": "raw.json",
    }
    hwprofile.validate(doc, where="calibrate result")
    return doc


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the whole new one, never a part."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes 0600; in a container running as root that file would be unreadable to the
        # node's login user who fetches it. Give it the mode a plain open() would (0666 & ~umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
