"""The report's per-node hardware and software lines, from the manifest's node records.

Why: a figure is only comparable with the machine it came from. Preflight records each node's GPUs
(nvidia-smi -q essentials), topology, IB ports and rates, kernel and OS, and the engine version and image
digest; the NCCL version is what the NCCL gate read from each node's log. An emulated GPU stand-in (the
test rig's) is said to be one, never shown as hardware.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _nccl_version(run_dir: Path, host: str) -> str | None:
    path = run_dir / "nodes" / host / "server" / f"{host}_nccl_gate.json"
    try:
        gate = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    versions = [log.get("nccl_version") for log in gate.get("logs") or [] if isinstance(log, dict)]
    return next((v for v in versions if v), None)


def _gpus(gpu: dict[str, Any] | None) -> str:
    if not gpu or not gpu.get("gpus"):
        return (gpu or {}).get("note") or "no GPU recorded"
    parts = []
    for g in gpu["gpus"]:
        bits = [
            f"ECC {g.get('ecc') or 'n/a'}",
            f"power limit {g['power_limit_w']:g} W" if g.get("power_limit_w") is not None else None,
            f"max SM {g['max_sm_clock_mhz']:g} MHz" if g.get("max_sm_clock_mhz") is not None else None,
            f"max mem {g['max_mem_clock_mhz']:g} MHz" if g.get("max_mem_clock_mhz") is not None else None,
        ]
        parts.append(f"{g.get('count', 1)} x {g.get('name')} ({', '.join(b for b in bits if b)})")
    text = "; ".join(parts) + f", driver {gpu.get('driver_version')}, CUDA {gpu.get('cuda_version')}"
    if gpu.get("emulated"):
        text += f" — **emulated** ({gpu.get('note')})"
    return text


def _ib(ports: list[dict[str, Any]]) -> str:
    if not ports:
        return "no InfiniBand port"
    return ", ".join(
        f"{p.get('device')}:{p.get('port')} {p.get('rate') or 'rate n/a'} {p.get('state') or 'state n/a'}"
        f" {p.get('link_layer') or ''}".rstrip()
        for p in ports
    )


def setup_lines(manifest: dict[str, Any], run_dir: Path) -> list[str]:
    """Markdown bullet lines: engine version and digest, then one block per node."""
    lines: list[str] = []
    version, digest = manifest.get("engine_version"), manifest.get("engine_image_digest")
    if version or digest:
        lines.append(f"- engine version: {version or 'unknown'} (image digest {digest or 'n/a'})")
    records = manifest.get("nodes_record")
    if not isinstance(records, dict):
        return lines
    for host, rec in records.items():
        if not isinstance(rec, dict):
            continue
        nccl = _nccl_version(run_dir, host)
        lines.append(f"- node `{host}`: {_gpus(rec.get('gpu'))}")
        lines.append(f"  - IB: {_ib(rec.get('ib') or [])}")
        nccl_text = nccl or "n/a (no gate verdict)"
        lines.append(f"  - NCCL {nccl_text}; kernel {rec.get('kernel')}; OS {rec.get('os') or 'n/a'}")
        topo = (rec.get("gpu") or {}).get("topology")
        if topo:
            rows = len(topo.splitlines())
            lines.append(f"  - topology (`nvidia-smi topo -m`): {rows} lines, kept in the manifest")
    return lines
