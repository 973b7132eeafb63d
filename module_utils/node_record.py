# Copyright: quickmap contributors
# Apache-2.0
"""A node's hardware and software record from the text its tools print (pure functions).

Why: a figure means little without the machine it came from (GPU model, driver, CUDA, clocks, ECC,
power limit, topology, IB link rates, kernel, OS). The module ``node_facts`` runs the tools; these
functions read their output. ``nvidia-smi -q`` is an indented ``Key : value`` tree: sections are
lines without a colon-value, their children are indented deeper.
"""

from __future__ import annotations

import re

# nvidia-smi pads every key with spaces before its colon; a section name has none (`GPU 00000000:04:00.0`).
_KV = re.compile(r"^(?P<indent>\s*)(?P<key>\S.*?)\s+:\s*(?P<value>.*?)\s*$")


def _tree(text: str) -> list[tuple[tuple[str, ...], str]]:
    """(section path + key, value) for every `Key : value` line of nvidia-smi -q, in order."""
    out: list[tuple[tuple[str, ...], str]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _KV.match(line)
        if m and m.group("value") != "":
            out.append(((*[s for _, s in stack], m.group("key").strip()), m.group("value")))
        else:
            stack.append((indent, line.strip().rstrip(":").strip()))
    return out


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def parse_smi_q(text: str) -> dict:
    """Essentials of `nvidia-smi -q`: driver, CUDA, and per GPU model, clocks, ECC, power limit, memory."""
    record: dict = {"driver_version": None, "cuda_version": None, "gpus": []}
    gpu: dict | None = None
    for path, value in _tree(text):
        if len(path) == 1:
            if path[0] == "Driver Version":
                record["driver_version"] = value
            elif path[0] == "CUDA Version":
                record["cuda_version"] = value
            continue
        head = path[0]
        if head.startswith("GPU ") and (gpu is None or gpu["bus_id"] != head[4:]):
            gpu = {"bus_id": head[4:]}
            record["gpus"].append(gpu)
        if gpu is None:
            continue
        rest = path[1:]
        if rest == ("Product Name",):
            gpu["name"] = value
        elif rest == ("GPU UUID",):
            gpu["uuid"] = value
        elif rest == ("ECC Mode", "Current"):
            gpu["ecc"] = value
        elif rest in (("GPU Power Readings", "Current Power Limit"), ("Power Readings", "Power Limit")):
            gpu["power_limit_w"] = _number(value)
        elif rest == ("Max Clocks", "SM"):
            gpu["max_sm_clock_mhz"] = _number(value)
        elif rest == ("Max Clocks", "Memory"):
            gpu["max_mem_clock_mhz"] = _number(value)
        elif rest == ("FB Memory Usage", "Total"):
            gpu["memory_total_mib"] = _number(value)
        elif rest in (("PCI", "GPU Link Info", "PCIe Generation", "Max"),):
            gpu["pcie_gen_max"] = value
    return record


def summarize_gpus(gpus: list[dict]) -> list[dict]:
    """Identical GPUs folded into one line with a count (a node's 8 GPUs are usually alike)."""
    keys = ("name", "ecc", "power_limit_w", "max_sm_clock_mhz", "max_mem_clock_mhz", "memory_total_mib")
    groups: list[dict] = []
    for gpu in gpus:
        sig = {k: gpu.get(k) for k in keys}
        for group in groups:
            if all(group.get(k) == sig[k] for k in keys):
                group["count"] += 1
                break
        else:
            groups.append({**sig, "count": 1})
    return groups


def parse_os_release(text: str) -> str | None:
    """PRETTY_NAME of /etc/os-release (quotes removed)."""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None
