#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: record a node's hardware and software (GPUs, topology, IB ports, kernel, OS)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Record a node's GPUs, GPU topology, InfiniBand ports, kernel and OS
description:
  - >-
    Runs C(nvidia-smi -q) (driver, CUDA, per GPU model, max clocks, ECC mode, power limit, memory;
    identical GPUs folded with a count) and C(nvidia-smi topo -m) (kept as printed), reads every
    InfiniBand port's state, rate and link layer from sysfs, the kernel release and the OS name.
  - >-
    An nvidia-smi that says it is a stand-in (the test rig's) makes the record say C(emulated); a host
    without nvidia-smi records C(gpu=null) with the reason, never invented GPUs.
  - Writes the record as JSON to O(dest) (atomically); in check mode nothing is written.
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  nvidia_smi:
    description: nvidia-smi to run (name on PATH or a path).
    type: str
    default: nvidia-smi
  ib_dir:
    description: The InfiniBand sysfs class directory (C(<dev>/ports/<n>/{state,rate,link_layer})).
    type: path
    default: /sys/class/infiniband
  dest:
    description: Where to write the record (JSON). Empty = not written.
    type: path
    default: ""
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Preflight | this node's hardware and software record
  node_facts:
    dest: /var/tmp/quickmap/results/RUN/nodes/head_record.json
"""

RETURN = r"""
record:
  description: >-
    host, kernel, os, gpu (driver_version, cuda_version, gpus (folded), topology, emulated, note),
    ib (device, port, state, rate, link_layer), ib_dir.
  returned: always
  type: dict
"""

import os  # noqa: E402
import platform  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_text  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.node_record import parse_os_release, parse_smi_q, summarize_gpus  # noqa: E402

argument_spec = dict(
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    ib_dir=dict(type="path", default="/sys/class/infiniband"),
    dest=dict(type="path", default=""),
)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def ib_ports(ib_dir: str) -> list[dict]:
    """Every port of every HCA under `ib_dir` (missing files are None: the record never guesses)."""
    out = []
    try:
        devices = sorted(os.listdir(ib_dir))
    except OSError:
        return out
    for dev in devices:
        ports_dir = os.path.join(ib_dir, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir))
        except OSError:
            out.append({"device": dev, "port": None, "state": None, "rate": None, "link_layer": None})
            continue
        for port in ports:
            base = os.path.join(ports_dir, port)
            out.append(
                {
                    "device": dev,
                    "port": port,
                    "state": _read(os.path.join(base, "state")),
                    "rate": _read(os.path.join(base, "rate")),
                    "link_layer": _read(os.path.join(base, "link_layer")),
                }
            )
    return out


def gpu_record(module: AnsibleModule, nvidia_smi: str) -> dict | None:
    binary = module.get_bin_path(nvidia_smi, opt_dirs=["/usr/bin", "/usr/local/bin", "/usr/sbin"])
    if not binary:
        return {"gpus": [], "note": f"{nvidia_smi} not found: no GPU recorded", "emulated": False}
    rc, out, err = module.run_command([binary, "-q"])
    if rc != 0:
        note = f"{binary} -q exited {rc}: {(err or out).strip()[-300:]}"
        return {"gpus": [], "note": note, "emulated": False}
    parsed = parse_smi_q(out)
    marks = [line.split(" : ", 1)[-1].strip() for line in out.splitlines() if "stand-in" in line]
    stand_in = marks[0] if marks else None
    rc, topo, err = module.run_command([binary, "topo", "-m"])
    return {
        "driver_version": parsed["driver_version"],
        "cuda_version": parsed["cuda_version"],
        "gpus": summarize_gpus(parsed["gpus"]),
        "gpu_count": len(parsed["gpus"]),
        "topology": topo if rc == 0 else f"nvidia-smi topo -m exited {rc}: {(err or topo).strip()[-300:]}",
        "emulated": stand_in is not None,
        "note": stand_in,
    }


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    record = {
        "host": platform.node(),
        "kernel": platform.release(),
        "os": parse_os_release(_read("/etc/os-release") or ""),
        "gpu": gpu_record(module, p["nvidia_smi"]),
        "ib_dir": p["ib_dir"],
        "ib": ib_ports(p["ib_dir"]),
    }
    written = False
    if p["dest"] and not module.check_mode:
        import json

        atomic_write_text(p["dest"], json.dumps(record, indent=1))
        written = True
    module.exit_json(changed=written, record=record, dest_written=written)


if __name__ == "__main__":
    main()
