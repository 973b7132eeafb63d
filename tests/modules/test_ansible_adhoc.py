"""Every module loads and runs inside real Ansible (`ansible localhost -m <module> -M library`).

The unit tests call ``main()`` directly; this proves the same files work once AnsiballZ packs them with
their module_utils (found through ANSIBLE_MODULE_UTILS, as ansible.cfg's ``module_utils`` does), with
check mode honoured and failures reported as FAILED with the module's message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / ".venv" / "bin" / "ansible"
RESULT = re.compile(r"^localhost \| (?P<status>SUCCESS|FAILED!) => (?P<json>\{.*\})\s*$", re.S | re.M)

pytestmark = pytest.mark.skipif(not ANSIBLE.exists(), reason=f"{ANSIBLE} not installed (make venv)")

NCCL_OK = (
    "[2026-12-02 14:00:05 TP0] Init torch distributed begin.\n"
    "node-a:1234:1290 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    "node-a:1234:1290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB eth0:10.0.0.1<0>\n"
    "node-a:1234:1290 [0] NCCL INFO Using network IB\n"
)
NCCL_BAD = (
    "node-b:4321:4377 [0] NCCL INFO NET/IB : No device found.\n"
    "node-b:4321:4377 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\n"
    "node-b:4321:4377 [0] NCCL INFO Using network Socket\n"
)


def adhoc(tmp_path: Path, module: str, args: dict, check: bool = False, path_env: str | None = None) -> tuple:
    """Run one ad-hoc task on localhost; return (status, result dict, full stdout)."""
    home = tmp_path / "ansible_home"
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nretry_files_enabled = false\ninterpreter_python = auto_silent\n")
    env = dict(os.environ)
    env.update(
        LC_ALL="C.UTF-8",
        ANSIBLE_CONFIG=str(cfg),
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_REMOTE_TEMP=str(home / "remote_tmp"),
        ANSIBLE_MODULE_UTILS=str(REPO / "module_utils"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_LOCALHOST_WARNING="false",
    )
    if path_env is not None:
        env["PATH"] = path_env
    argv = [str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-M", str(REPO / "library")]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", module]
    if args:
        argv += ["-a", json.dumps(args)]
    if check:
        argv.append("--check")
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    m = RESULT.search(proc.stdout)
    assert m, f"no result line (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return m.group("status"), json.loads(m.group("json")), proc.stdout + proc.stderr


def test_all_modules_run_under_ansible(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "head.log").write_text(NCCL_OK)
    (logs / "worker.log").write_text(NCCL_BAD)
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "schema": "quickmap.loadgen/1",
                "complete": True,
                "completed": 2,
                "failed": 0,
                "requests": [{"index": i, "success": True, "output_tokens": 16} for i in range(2)],
            }
        )
    )
    gate = tmp_path / "server" / "head_nccl_gate.json"
    empty_bin = tmp_path / "empty_bin"
    empty_bin.mkdir()
    hcas = ["mlx5_0:1", "mlx5_3:1"]
    cases = {
        "nccl_check": (
            "nccl_transport",
            {"log": str(logs / "head.log"), "expected_hcas": hcas, "nnodes": 2, "dest": str(gate)},
        ),
        "nccl_bad": (
            "nccl_transport",
            {"logs": [str(logs / "head.log"), str(logs / "worker.log")], "expected_hcas": hcas, "nnodes": 2},
        ),
        "bench": ("bench_result", {"path": str(bench), "expect_requests": 2, "expect_output_len": 16}),
        "gpu_allowed": ("gpu_idle", {"allow_missing": True}),
        "port": ("port_free", {"port": 1}),
        "stale": ("server_stale", {"pid_file": str(tmp_path / "none.pid")}),
    }
    no_gpu_path = f"{empty_bin}{os.pathsep}/usr/bin{os.pathsep}/bin"
    for name in cases:
        (tmp_path / name).mkdir()
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(
                adhoc,
                tmp_path / name,
                module,
                args,
                check=(name == "nccl_check"),
                path_env=no_gpu_path if module == "gpu_idle" else None,
            )
            for name, (module, args) in cases.items()
        }
        out = {name: f.result() for name, f in futures.items()}

    status, res, _ = out["nccl_check"]
    assert status == "SUCCESS" and res["passed"] is True and res["changed"] is False
    assert res["logs"][0]["hcas"] == hcas and res["logs"][0]["oob_if"] == "eth0"
    assert res["would_write"] == str(gate) and not gate.exists()  # --check writes nothing

    status, res, _ = out["nccl_bad"]
    assert status == "FAILED!" and "worker.log" in res["msg"] and "No device found" in res["msg"]
    assert [e["transport"] for e in res["logs"]] == ["ib", "socket"]

    status, res, _ = out["bench"]
    assert status == "SUCCESS" and res["format"] == "loadgen" and res["completed"] == 2

    status, res, _ = out["gpu_allowed"]
    assert status == "SUCCESS" and res["checked"] is False and res["gpus_idle"] is None

    status, res, _ = out["port"]
    assert status == "SUCCESS" and res["free"] is True

    status, res, _ = out["stale"]
    assert status == "SUCCESS" and res["stale"] is False
