"""The calibration on two real (namespaced) hosts: `ansible-playbook quick_map.yml -i <rig> --tags calibrate`.

Through the user's command line: real SSH, the calibrate role's `docker run --gpus device=N` per GPU run
by the rig's docker shim (which stands in for the GPU by replaying the H200 measurement shipped in the
calibration zipapp), the profiles fetched home, the gate judging 16 GPUs. A slow GPU is planted with the
shim's test-only hook (`<host>/docker/gpu_plant.json`) and must fail the gate by node, index and figure,
both under --tags calibrate and as preflight's quick health check (before any server starts).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .ansible_cli import AnsibleRunner
from .core import REPO, Rig, RigHost
from .test_rig_map import docker_runs, live_containers, option_values, read_json, run_dir, tail

pytestmark = [pytest.mark.rig, pytest.mark.slow]

GPUS = [str(i) for i in range(8)]
IMAGE = yaml.safe_load((REPO / "inventory" / "dual" / "group_vars" / "all.yml").read_text())["engine_image"]


@pytest.fixture(scope="module", autouse=True)
def calibrate_pyz() -> Path:
    """build/calibrate.pyz (`make zipapp`; built here when missing)."""
    from enginesim.calibrate import zipapp

    pyz = REPO / "build" / "calibrate.pyz"
    if not pyz.exists():
        zipapp.build(str(pyz))
    return pyz


@pytest.fixture
def plant(rig: Rig) -> Iterator[callable]:
    """Plant slow GPUs through the docker shim's test-only hook; removed after the test."""
    planted: list[Path] = []

    def _plant(host: RigHost, gpu: str, **factors: float) -> None:
        path = host.docker_home / "gpu_plant.json"
        path.write_text(json.dumps({gpu: factors}))
        planted.append(path)

    yield _plant
    for path in planted:
        path.unlink(missing_ok=True)


def calibrate(ansible: AnsibleRunner, run_id: str, *extra: str):
    return ansible.playbook(
        "quick_map.yml", "--tags", "calibrate", "-e", f"run_id={run_id}", *extra, timeout=400
    )


def calibration_runs(host: RigHost, since: float) -> list[list[str]]:
    """argv of the calibration containers started on `host` since `since`."""
    return [
        c["argv"] for c in docker_runs(host, since) if any(a.endswith("calibrate.pyz") for a in c["argv"])
    ]


def test_check_prints_every_gpus_command_and_runs_nothing(ansible: AnsibleRunner, rig: Rig) -> None:
    since = time.time()
    proc = calibrate(ansible, "rig-cal-check", "--check")
    assert proc.returncode == 0, tail(proc)
    for gpu in GPUS:
        assert f"docker run -d --name quickmap-calibrate-gpu{gpu} --gpus device={gpu}" in proc.stdout
    assert "--sections bandwidth,gemm,attention,launch,model" in proc.stdout
    assert all(calibration_runs(h, since) == [] for h in rig.hosts)
    assert not (run_dir(rig, "rig-cal-check") / "calibration").exists()


def test_healthy_fleet_passes_with_every_gpu_measured_in_the_engine_image(
    ansible: AnsibleRunner, rig: Rig
) -> None:
    since = time.time()
    proc = calibrate(ansible, "rig-cal-ok")
    assert proc.returncode == 0, tail(proc)
    cal = run_dir(rig, "rig-cal-ok") / "calibration"
    gate = read_json(cal / "gate.json")
    assert gate["passed"] is True and gate["gated"] == 16, gate["msg"]
    assert "16 NVIDIA H200 on 2 node(s) pass" in gate["msg"]
    for host in rig.hosts:
        runs = calibration_runs(host, since)
        assert sorted(option_values(a, "--gpus")[0] for a in runs) == sorted(f"device={g}" for g in GPUS)
        for argv in runs:
            assert IMAGE in argv, argv  # the engine's image, the serving runtime
        assert (cal / host.name / "calibrate_cmd.txt").is_file()
        for gpu in GPUS:
            d = cal / host.name / f"gpu{gpu}"
            doc = read_json(d / "profile.json")
            assert doc["device"] == "cuda" and (d / "raw.json").is_file()
            assert (d / "exit_code").read_text().strip() == "0"
            assert "[calibrate] gemm" in (d / "calibrate.log").read_text()
            assert read_json(d / "inspect.json")[0]["Config"]["Image"] == IMAGE
    assert live_containers(rig) == []  # every calibration container was removed after its log was kept


def test_planted_slow_gpu_fails_the_gate_by_node_index_and_figure(
    ansible: AnsibleRunner, rig: Rig, plant: callable
) -> None:
    plant(rig.host("worker"), "5", bandwidth=0.8)
    proc = calibrate(ansible, "rig-cal-slow")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "GPU health gate failed closed" in out, tail(proc)
    assert (
        "worker GPU 5: HBM read 3.51 TB/s is 20.0% below the fleet median 4.39 TB/s of 16 NVIDIA H200" in out
    )
    gate = read_json(run_dir(rig, "rig-cal-slow") / "calibration" / "gate.json")
    assert gate["passed"] is False
    assert [(r["host"], r["gpu"]) for r in gate["rows"] if r["state"] == "fail"] == [("worker", "5")]
    assert live_containers(rig) == []


def test_preflight_health_check_stops_the_map_before_any_server(
    ansible: AnsibleRunner, rig: Rig, plant: callable
) -> None:
    plant(rig.host("head"), "2", gemm=0.5)
    since = time.time()
    proc = ansible.playbook(
        "quick_map.yml", "-e", "run_id=rig-cal-preflight", "-e", "preflight_gpu_health=true", timeout=400
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "head GPU 2: bf16 GEMM 377 TFLOP/s is 50.0% below the fleet median 753 TFLOP/s" in out, tail(proc)
    assert "below the datasheet 989 TFLOP/s (h200; margin 35%)" in out
    for host in rig.hosts:
        runs = calibration_runs(host, since)
        assert len(runs) == 8 and all("--quick" in a and "bandwidth,gemm" in a for a in runs)
        engines = [c for c in docker_runs(host, since) if "sglang.launch_server" in c["argv"]]
        assert engines == [], "a server started although the health check failed"
