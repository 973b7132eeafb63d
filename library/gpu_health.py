#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: judge every GPU's calibration profile against its fleet and its datasheet."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Fail-closed GPU health gate over calibration profiles (fleet median and datasheet)
description:
  - >-
    Reads the C(profile.json) that C(python -m enginesim.calibrate) wrote for each GPU (one directory per
    GPU, as listed in O(results)) and judges two figures per GPU: HBM read bandwidth and the bf16 GEMM
    rate at a prefill shape.
  - >-
    A GPU fails when either figure is more than O(tolerance) below the median of the GPUs of the same
    model across all nodes, or more than O(datasheet_margin) below its datasheet figure (the
    C(mem_bw)/C(peak_flops) the profile carries from the datasheet profile it was based on). The
    failure message names the node, the GPU index and the figure.
  - >-
    Fails closed: a GPU with no C(profile.json) (the calibration died, timed out or was refused; the
    end of its C(calibrate.log) is quoted), an unreadable profile, a missing figure, a non-zero exit
    code, or a CPU profile where a GPU was expected (O(expect_device=cuda)) fails the gate.
  - >-
    A CPU profile (the calibration's no-GPU path, C(device=cpu)) is never judged as a GPU: with
    O(expect_device=cpu) or V(any) it is recorded with C(state=not_gated) and RV(gated) counts only GPUs.
  - Read-only; runs the same in check mode, except that O(dest) is not written.
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  results:
    description:
      - One entry per calibrated device, C(host) (the inventory host), C(gpu) (the GPU index as a
        string, V(cpu), or V(all) for a node that failed before its GPUs were listed, which fails) and
        C(dir) (the directory holding its C(profile.json), C(exit_code) and C(calibrate.log) on the
        machine the module runs on).
    type: list
    elements: dict
    required: true
  tolerance:
    description: Largest fraction a GPU's figure may fall below its fleet median (V(0.10) = 10%).
    type: float
    default: 0.10
  datasheet_margin:
    description:
      - Largest fraction a GPU's figure may fall below its datasheet figure. Kernels never reach the
        datasheet; a healthy H200 measured 0.91 of its HBM figure and 0.76 of its bf16 rate.
    type: float
    default: 0.35
  expect_device:
    description:
      - V(cuda) (a GPU fleet; a CPU profile fails), V(cpu) (the embedded inventory; profiles are
        recorded, not gated) or V(any).
    type: str
    choices: [cuda, cpu, any]
    default: cuda
  dest:
    description: Write the verdict as JSON to this path, atomically, pass or fail. Not written in check mode.
    type: path
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - The rule lives in C(module_utils/gpu_fleet.py) (pure, unit-tested).
  - The result always has C(changed=false).
"""

EXAMPLES = r"""
- name: Calibrate | judge every GPU of every node
  gpu_health:
    results:
      - {host: head, gpu: "0", dir: "{{ run_dir }}/calibration/head/gpu0"}
      - {host: worker, gpu: "0", dir: "{{ run_dir }}/calibration/worker/gpu0"}
    tolerance: 0.10
    datasheet_margin: 0.35
    dest: "{{ run_dir }}/calibration/gate.json"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
passed:
  description: True when every device passed (CPU profiles only count as recorded).
  returned: always
  type: bool
msg:
  description: One-line verdict; on failure names each failing node, GPU index and figure.
  returned: always
  type: str
  sample: "worker GPU 5: HBM read 3.51 TB/s is 20.0% below the fleet median 4.39 TB/s of 16 NVIDIA H200"
gated:
  description: Number of GPUs judged (never counts a CPU profile).
  returned: always
  type: int
not_gated:
  description: Number of CPU profiles recorded without judgement.
  returned: always
  type: int
failures:
  description: One line per failing device and rule.
  returned: always
  type: list
  elements: str
fleet:
  description: Per GPU model, the number of GPUs, the hosts and the median of each figure.
  returned: always
  type: dict
rows:
  description: One entry per device with its figures, ratios to median and datasheet, state and problems.
  returned: always
  type: list
  elements: dict
dest_written:
  description: Whether O(dest) was written.
  returned: when O(dest) is set
  type: bool
"""

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_json  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.gpu_fleet import (  # noqa: E402
    GateInputError,
    judge_fleet,
    rule_text,
    verdict_message,
)

argument_spec = dict(
    results=dict(type="list", elements="dict", required=True),
    tolerance=dict(type="float", default=0.10),
    datasheet_margin=dict(type="float", default=0.35),
    expect_device=dict(type="str", choices=["cuda", "cpu", "any"], default="cuda"),
    dest=dict(type="path"),
)

LOG_TAIL_BYTES = 4096


def _tail(path: str) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace").splitlines()[-20:]
    except OSError:
        return []


def read_record(entry: dict) -> dict:
    """One device's files -> the record the pure judge takes (a missing file is an error, not a skip)."""
    directory = str(entry.get("dir") or "")
    rec = {"host": entry.get("host"), "gpu": str(entry.get("gpu", "")), "profile": None, "error": None}
    rec["log_tail"] = _tail(os.path.join(directory, "calibrate.log"))
    try:
        with open(os.path.join(directory, "exit_code"), encoding="utf-8") as handle:
            text = handle.read().strip()
        rec["exit_code"] = int(text) if text.lstrip("-").isdigit() else text
    except OSError:
        rec["exit_code"] = None
    path = os.path.join(directory, "profile.json")
    try:
        with open(path, encoding="utf-8") as handle:
            rec["profile"] = json.load(handle)
    except FileNotFoundError:
        rec["error"] = f"{path} does not exist"
    except (OSError, ValueError) as exc:
        rec["error"] = f"{path} unreadable: {exc}"
    return rec


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    for entry in p["results"]:
        if not isinstance(entry, dict) or not {"host", "gpu", "dir"} <= set(entry):
            module.fail_json(
                msg=f"gpu_health: results entry {entry!r} (rule: a dict with host, gpu and dir)", passed=False
            )
    records = [read_record(entry) for entry in p["results"]]
    try:
        verdict = judge_fleet(records, p["tolerance"], p["datasheet_margin"], p["expect_device"])
    except GateInputError as exc:
        module.fail_json(msg=f"gpu_health: {exc}", passed=False)
    result = dict(verdict)
    result["changed"] = False
    result["rule"] = rule_text(p["tolerance"], p["datasheet_margin"])
    result["tolerance"] = p["tolerance"]
    result["datasheet_margin"] = p["datasheet_margin"]
    result["expect_device"] = p["expect_device"]
    result["msg"] = verdict_message(verdict, p["tolerance"], p["datasheet_margin"])
    if p["dest"]:
        if module.check_mode:
            result["dest_written"] = False
        else:
            doc = dict(result)
            doc.pop("changed", None)
            doc["schema"] = "quickmap.gpu_health/1"
            doc["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            try:
                atomic_write_json(p["dest"], doc)
            except OSError as exc:
                module.fail_json(msg=f"gpu_health: cannot write dest {p['dest']}: {exc}", **result)
            result["dest_written"] = True
    if not result["passed"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
