#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: prove no compute process holds a GPU before a server starts (or say it cannot)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_idle
short_description: Check that no stray compute process is running on the host's GPUs
description:
  - >-
    Runs C(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader) and
    fails when any compute process is listed, naming its pid, process name and GPU memory. A stray
    process (a server left from an earlier run, someone's notebook) skews or breaks a benchmark.
    A first line that is nvidia-smi's CSV header (C(pid, process_name, used_gpu_memory [MiB]), printed by
    a wrapper that drops C(noheader)) is skipped; any other line it cannot parse fails the check.
  - >-
    On a host without C(nvidia-smi) the GPUs cannot be proven idle, so the module fails unless
    O(allow_missing=true), in which case it succeeds with RV(gpus_idle=null) and RV(checked=false)
    (the embedded enginesim inventory sets this). It never reports idle GPUs it did not check.
  - A non-zero exit of C(nvidia-smi) (driver not loaded, GPU lost) fails with its rc, stdout and stderr.
  - Read-only, so it runs the same in check mode. The result always has C(changed=false).
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  nvidia_smi:
    description:
      - Path (or command name looked up on PATH) of nvidia-smi. Default is C(nvidia-smi) on PATH
        (and the sbin directories).
    type: str
  allow_missing:
    description:
      - Succeed, with RV(checked=false) and RV(gpus_idle=null), when nvidia-smi is not installed.
        Only for hosts that truly have no NVIDIA GPU (the emulated engine).
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - Put the task under a C(timeout) keyword if nvidia-smi may hang on a broken GPU.
"""

EXAMPLES = r"""
- name: Preflight | no stray GPU process before the server starts
  gpu_idle:

- name: Preflight | GPUs idle, or honestly unchecked on the enginesim host
  gpu_idle:
    allow_missing: "{{ preflight_gpu_check_optional | bool }}"
  register: preflight_gpu_idle
"""

RETURN = r"""
gpus_idle:
  description: True when no compute process is listed; null when nvidia-smi is missing and allowed.
  returned: always
  type: bool
checked:
  description: Whether nvidia-smi was actually run.
  returned: always
  type: bool
processes:
  description: Compute processes listed by nvidia-smi.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: Process id., type: int}
    name: {description: Process name as nvidia-smi prints it., type: str}
    used_memory: {description: GPU memory as printed (for example "1024 MiB")., type: str}
    used_memory_mib: {description: GPU memory in MiB (null when nvidia-smi prints N/A)., type: int}
nvidia_smi:
  description: The nvidia-smi binary used (null when not found).
  returned: always
  type: str
host:
  description: The host name the check ran on.
  returned: always
  type: str
msg:
  description: One-line verdict.
  returned: always
  type: str
  sample: "no GPU compute process on node-a"
"""

import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

QUERY = ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
RULE = "no stray GPU compute process before a server starts"
_MEM = re.compile(r"(?P<n>\d+)\s*MiB")  # fullmatch
# The CSV header nvidia-smi prints without `noheader` (a capture or a site wrapper may keep it).
_HEADERS = (("pid", "process_name", "used_gpu_memory [mib]"), ("pid", "process_name", "used_memory [mib]"))

argument_spec = dict(
    nvidia_smi=dict(type="str"),
    allow_missing=dict(type="bool", default=False),
)


def parse_compute_apps(stdout: str) -> list[dict]:
    """Parse ``pid, name, memory`` CSV lines (the name may itself contain commas).

    A first line that is nvidia-smi's own CSV header (``pid, process_name, used_gpu_memory [MiB]``)
    is skipped; any other line that is not that shape is refused.

    Raises ValueError naming the line when it is not that shape: an unreadable answer must not be
    mistaken for "no process".
    """
    processes = []
    first = True
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line or line.lower().startswith("no running processes found"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if first and tuple(f.lower() for f in fields) in _HEADERS:
            first = False
            continue  # the CSV header line, only as the first line
        first = False
        if len(fields) < 3 or not fields[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi line {line!r} (want 'pid, process_name, used_memory')")
        memory = fields[-1]
        m = _MEM.fullmatch(memory)
        processes.append(
            {
                "pid": int(fields[0]),
                "name": ", ".join(fields[1:-1]),
                "used_memory": memory,
                "used_memory_mib": int(m.group("n")) if m else None,
            }
        )
    return processes


def find_nvidia_smi(module: AnsibleModule) -> str | None:
    """The binary to run, or None when it is not installed."""
    wanted = module.params["nvidia_smi"] or "nvidia-smi"
    if os.sep in wanted:
        return wanted if os.path.isfile(wanted) and os.access(wanted, os.X_OK) else None
    return module.get_bin_path(wanted, required=False)


def run(module: AnsibleModule) -> tuple[bool, dict]:
    """Return (ok, result)."""
    host = platform.node()
    result: dict = {"changed": False, "host": host, "processes": [], "nvidia_smi": None}
    binary = find_nvidia_smi(module)
    if binary is None:
        wanted = module.params["nvidia_smi"] or "nvidia-smi"
        result.update(gpus_idle=None, checked=False)
        if module.params["allow_missing"]:
            result["msg"] = f"{wanted} not found on {host}: GPUs not checked (allow_missing=true)"
            return True, result
        result["msg"] = f"{wanted} not found on {host}: cannot prove the GPUs are idle (rule: {RULE})"
        return False, result
    result["nvidia_smi"] = binary
    try:
        rc, out, err = module.run_command(
            [binary, *QUERY], environ_update={"LC_ALL": "C", "LANG": "C"}, handle_exceptions=False
        )
    except OSError as exc:
        result.update(gpus_idle=None, checked=False, msg=f"cannot run {binary} on {host}: {exc}")
        return False, result
    result.update(rc=rc, stdout=out, stderr=err)
    if rc != 0:
        detail = (err.strip() or out.strip() or "no output").splitlines()[0]
        result.update(gpus_idle=None, checked=False, msg=f"{binary} failed on {host} (rc={rc}): {detail}")
        return False, result
    try:
        processes = parse_compute_apps(out)
    except ValueError as exc:
        result.update(gpus_idle=None, checked=True, msg=f"{binary} on {host}: {exc}")
        return False, result
    result.update(processes=processes, checked=True, gpus_idle=not processes)
    if processes:
        listed = ", ".join(f"pid {p['pid']} {p['name']} ({p['used_memory']})" for p in processes)
        result["msg"] = f"GPU compute process(es) running on {host}: {listed} (rule: {RULE})"
        return False, result
    result["msg"] = f"no GPU compute process on {host}"
    return True, result


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    ok, result = run(module)
    if not ok:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
