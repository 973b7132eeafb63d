"""`nvidia-smi` stand-in for the rig hosts (8 emulated GPUs; engines under the docker shim hold them).

The dual inventory requires nvidia-smi (preflight_gpu_allow_missing: false). On the rig, a GPU is "busy"
exactly when a container started through the docker shim is running on this host, so a server left
from an earlier run shows up in `--query-compute-apps` the way a real one would. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

GPUS = 8


def running_engines() -> list[dict]:
    """Containers of this host's docker shim whose engine process is alive."""
    root = Path(os.environ.get("QM_SHIM_HOME", "")) / "containers"
    found = []
    for state_file in sorted(root.glob("*/state.json")) if root.name else []:
        state = json.loads(state_file.read_text())
        pid = state.get("pid")
        if state.get("status") == "running" and pid and Path(f"/proc/{pid}").exists():
            found.append(state)
    return found


GPU_FIELDS = ("index", "name", "uuid", "memory.total", "driver_version")
STAND_IN = "quickmap rig nvidia-smi stand-in: emulated, no GPU on this host"


def query_all() -> str:
    """`nvidia-smi -q` in the real layout (the keys node_facts reads), saying it is a stand-in."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"Note                                      : {STAND_IN}",
        "Driver Version                            : 580.159.04",
        "CUDA Version                              : 13.0",
        "",
        f"Attached GPUs                             : {GPUS}",
    ]
    for gpu in range(GPUS):
        lines += [
            f"GPU 00000000:{0x18 + gpu:02X}:00.0",
            "    Product Name                          : NVIDIA H200",
            f"    GPU UUID                              : GPU-qmrig-{gpu:04d}",
            "    FB Memory Usage",
            "        Total                             : 143771 MiB",
            "    ECC Mode",
            "        Current                           : Enabled",
            "        Pending                           : Enabled",
            "    GPU Power Readings",
            "        Current Power Limit               : 700.00 W",
            "    Max Clocks",
            "        Graphics                          : 1980 MHz",
            "        SM                                : 1980 MHz",
            "        Memory                            : 3201 MHz",
            "",
        ]
    return "\n".join(lines)


def topology() -> str:
    """`nvidia-smi topo -m` of an 8-GPU NVSwitch node with two NICs (stand-in)."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(GPUS)) + "\tNIC0\tNIC1"
    rows = [head]
    for i in range(GPUS):
        nics = ["PIX", "SYS"] if i < GPUS // 2 else ["SYS", "PIX"]
        cells = ["X" if j == i else "NV18" for j in range(GPUS)] + nics
        rows.append(f"GPU{i}\t" + "\t".join(cells))
    rows += ["", "NIC Legend:", "", "  NIC0: mlx5_0", "  NIC1: mlx5_3", "", STAND_IN]
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """Answer the queries quickmap and operators use; anything else prints the GPU list.

    Like the real one, a stray argument (e.g. a query list split at its comma) or an unknown field is an
    error, so a wrongly built command line fails on the rig instead of passing.
    """
    if argv == ["topo", "-m"]:
        print(topology())
        return 0
    if argv == ["-q"]:
        print(query_all())
        return 0
    if any(not a.startswith("-") for a in argv):
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    gpu_fields = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--query-gpu=")), [])
    unknown = [f for f in gpu_fields if f not in GPU_FIELDS]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.')
        return 2
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-compute-apps=")), None)
    if query is not None:
        noheader = any("noheader" in a for a in argv)
        fields = query.split(",")
        if not noheader:
            print(", ".join(fields))
        for state in running_engines():
            values = {"pid": str(state["pid"]), "process_name": "python3", "used_memory": "128000 MiB"}
            for _gpu in range(GPUS):
                print(", ".join(values.get(f, "N/A") for f in fields))
        return 0
    gpu_query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if gpu_query is not None:
        fields = gpu_query.split(",")
        if not any("noheader" in a for a in argv):
            print(", ".join(fields))
        for gpu in range(GPUS):
            values = {
                "index": str(gpu),
                "name": "NVIDIA H200",
                "uuid": f"GPU-qmrig-{gpu:04d}",
                "memory.total": "143771 MiB",
                "driver_version": "580.159.04",
            }
            print(", ".join(values[f] for f in fields))
        return 0
    if "-L" in argv:
        for gpu in range(GPUS):
            print(f"GPU {gpu}: NVIDIA H200 (UUID: GPU-qmrig-{gpu:04d})")
        return 0
    print(f"quickmap rig nvidia-smi stand-in: {GPUS} x H200, {len(running_engines())} engine(s) running")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
