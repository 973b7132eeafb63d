"""node_facts and the report's Setup lines: the node record from real nvidia-smi -q text, the rig's
GPU stand-in recorded as emulated, IB ports from sysfs, and no GPU invented where nvidia-smi is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.module_utils.node_record import parse_os_release, parse_smi_q, summarize_gpus

from analysis.report import render
from analysis.setup_record import setup_lines

FIXTURE = Path(__file__).parent / "fixtures" / "node_record" / "nvidia_smi_q_v100_gpu0.txt"
SHIM = Path(__file__).resolve().parents[1] / "rig" / "nvidia_smi_shim.py"


def test_real_nvidia_smi_q_essentials() -> None:
    rec = parse_smi_q(FIXTURE.read_text())
    assert rec["driver_version"] == "550.127.05" and rec["cuda_version"] == "12.4"
    (gpu,) = rec["gpus"]
    assert gpu["bus_id"] == "00000000:00:04.0" and gpu["name"] == "Tesla V100-SXM2-16GB"
    assert gpu["ecc"] == "Enabled" and gpu["power_limit_w"] == 300.0
    assert gpu["max_sm_clock_mhz"] == 1530.0 and gpu["max_mem_clock_mhz"] == 877.0
    assert gpu["memory_total_mib"] == 16384.0
    folded = summarize_gpus([gpu, {**gpu, "bus_id": "x"}, {**gpu, "power_limit_w": 250.0}])
    assert [g["count"] for g in folded] == [2, 1]
    assert parse_os_release('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n') == "Ubuntu 22.04.4 LTS"


def _ib(tmp_path: Path) -> Path:
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (tmp_path / "ib" / "mlx5_3" / "ports" / "1").mkdir(parents=True)
    return tmp_path / "ib"


def test_stand_in_gpus_are_recorded_as_emulated(run, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {SHIM} "$@"\n')
    smi.chmod(0o755)
    dest = tmp_path / "out" / "head_node_record.json"
    status, res = run("node_facts", {"nvidia_smi": str(smi), "ib_dir": str(_ib(tmp_path)), "dest": str(dest)})
    assert status == "exit", res
    gpu = res["record"]["gpu"]
    assert gpu["emulated"] is True and "stand-in" in gpu["note"]
    assert gpu["gpu_count"] == 8 and gpu["gpus"][0]["count"] == 8 and gpu["gpus"][0]["name"] == "NVIDIA H200"
    assert "GPU0\tX\tNV18" in gpu["topology"]
    assert res["record"]["ib"][0] == {
        "device": "mlx5_0",
        "port": "1",
        "state": "4: ACTIVE",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
    }
    assert res["record"]["ib"][1]["rate"] is None  # a missing file is recorded as unknown, not guessed
    assert json.loads(dest.read_text()) == res["record"]


def test_missing_nvidia_smi_records_no_gpu_and_check_mode_writes_nothing(run, tmp_path: Path) -> None:
    dest = tmp_path / "rec.json"
    args = {"nvidia_smi": "/nonexistent/nvidia-smi", "ib_dir": str(tmp_path / "none"), "dest": str(dest)}
    status, res = run("node_facts", args, check_mode=True)
    assert (
        status == "exit"
        and res["record"]["gpu"]["gpus"] == []
        and "not found" in res["record"]["gpu"]["note"]
    )
    assert res["record"]["ib"] == [] and not dest.exists()


def test_report_setup_shows_every_node_and_says_emulated(run, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {SHIM} "$@"\n')
    smi.chmod(0o755)
    _, res = run("node_facts", {"nvidia_smi": str(smi), "ib_dir": str(_ib(tmp_path))})
    gate_dir = tmp_path / "run" / "nodes" / "head" / "server"
    gate_dir.mkdir(parents=True)
    (gate_dir / "head_nccl_gate.json").write_text(json.dumps({"logs": [{"nccl_version": "2.27.5"}]}))
    manifest = {
        "run_id": "r1",
        "engine_version": "0.5.6",
        "engine_image_digest": "sha256:abc",
        "nodes_record": {"head": res["record"]},
    }
    text = "\n".join(setup_lines(manifest, tmp_path / "run"))
    assert "- engine version: 0.5.6 (image digest sha256:abc)" in text
    assert "8 x NVIDIA H200 (ECC Enabled, power limit 700 W, max SM 1980 MHz, max mem 3201 MHz)" in text
    assert "**emulated**" in text and "driver 580.159.04, CUDA 13.0" in text
    assert "mlx5_0:1 400 Gb/sec (4X NDR) 4: ACTIVE InfiniBand" in text and "NCCL 2.27.5" in text
    report = render(tmp_path / "run", manifest, [], [], [], {}, [])
    assert "8 x NVIDIA H200" in report
