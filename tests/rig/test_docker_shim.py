"""The rig's docker shim on its own (no namespaces): argv recording, option parsing, daemon-side errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .docker_shim import container_env, engine_argv, parse_run, render

SHIM = Path(__file__).with_name("docker_shim.py")


def docker(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the shim the way the rig's `docker` wrapper does."""
    full_env = {
        **os.environ,
        "QM_SHIM_HOME": str(tmp_path / "docker"),
        "QM_SHIM_CALLS": str(tmp_path / "docker_calls.jsonl"),
        "QM_SHIM_PYTHON": sys.executable,
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, str(SHIM), *argv], capture_output=True, text=True, env=full_env, timeout=30
    )


def test_parse_run_splits_options_image_and_command() -> None:
    argv = [
        "-d", "--name", "qm", "--network", "host", "--ipc=host", "--shm-size", "32g",
        "-e", "A=1", "--env=B=2", "-e", "SECRET", "--device", "/dev/x", "-v", "/a:/b:ro",
        "--privileged", "-it",
        "img:tag", "python3", "-m", "sglang.launch_server", "--tp", "16", "-e", "not-an-option",
    ]  # fmt: skip
    parsed = parse_run(argv)
    assert parsed["image"] == "img:tag"
    assert parsed["cmd"] == ["python3", "-m", "sglang.launch_server", "--tp", "16", "-e", "not-an-option"]
    assert parsed["opts"]["-e"] == ["A=1", "SECRET"] and parsed["opts"]["--env"] == ["B=2"]
    assert parsed["opts"]["--ipc"] == ["host"] and parsed["opts"]["--device"] == ["/dev/x"]
    assert {"-d", "-i", "-t", "--privileged"} <= parsed["flags"]


def test_env_takes_values_and_names_from_the_callers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET", "s3")
    monkeypatch.delenv("ABSENT", raising=False)
    env = container_env({"-e": ["A=1", "SECRET", "ABSENT", "EMPTY="]}, "node")
    assert env["A"] == "1" and env["SECRET"] == "s3" and env["EMPTY"] == ""
    assert "ABSENT" not in env  # docker drops `-e NAME` when NAME is unset


def test_engine_argv_maps_only_the_engine_launchers() -> None:
    assert engine_argv(["python3", "-m", "sglang.launch_server", "--port", "1"])[1:] == [
        "-m", "enginesim", "sglang", "--port", "1",
    ]  # fmt: skip
    assert engine_argv(["vllm", "serve", "m", "--port", "1"])[3:] == ["vllm", "serve", "m", "--port", "1"]


def test_render_go_template_subset() -> None:
    doc = {"State": {"Running": True, "Pid": 7}, "Name": "/x"}
    assert render("{{.State.Running}} {{.State.Pid}} {{json .State}}", doc) == (
        'true 7 {"Running": true, "Pid": 7}'
    )


def test_missing_device_fails_like_the_daemon_and_starts_nothing(tmp_path: Path) -> None:
    argv = ["run", "-d", "--name", "qm", "--device", str(tmp_path / "uverbs3"), "img",
            "python3", "-m", "sglang.launch_server"]  # fmt: skip
    proc = docker(tmp_path, *argv)
    assert proc.returncode == 125
    assert f'adding custom device "{tmp_path / "uverbs3"}": no such file or directory' in proc.stderr
    assert not (tmp_path / "docker" / "containers" / "qm").exists()
    calls = [json.loads(line) for line in (tmp_path / "docker_calls.jsonl").read_text().splitlines()]
    assert calls[0]["argv"] == ["docker", *argv] and calls[0]["time"] > 0


def test_unknown_flag_and_foreign_command_are_refused(tmp_path: Path) -> None:
    proc = docker(tmp_path, "run", "-d", "--bogus", "x", "img")
    assert proc.returncode == 125 and "unknown flag: --bogus" in proc.stderr
    proc = docker(tmp_path, "run", "-d", "--name", "b", "img", "bash", "-c", "true")
    assert proc.returncode == 127 and "sglang.launch_server" in proc.stderr
    proc = docker(tmp_path, "pull", "img")
    assert proc.returncode == 125 and "not a docker command" in proc.stderr


def test_unknown_container_is_an_error(tmp_path: Path) -> None:
    proc = docker(tmp_path, "inspect", "nope")
    assert proc.returncode == 1 and "No such object: nope" in proc.stderr
    assert json.loads(proc.stdout) == []
    proc = docker(tmp_path, "ps", "-a", "--filter", "name=nope", "--format", "{{.Names}} {{.Status}}")
    assert proc.returncode == 0 and proc.stdout == ""
    proc = docker(tmp_path, "version", "--format", "{{.Server.Version}}")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("qmrig")


# ------------------------------------------------------------------ the calibration's GPU stand-in


@pytest.fixture(scope="module")
def calib_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from enginesim.calibrate import zipapp

    return Path(zipapp.build(str(tmp_path_factory.mktemp("bin") / "calibrate.pyz")))


def calib_run(
    tmp_path: Path, pyz: Path, gpu: int, *opts: str, mounts: bool = True
) -> subprocess.CompletedProcess[str]:
    """`docker run -d` of one GPU's calibration, as roles/calibrate renders it (same-path bind mounts)."""
    out = tmp_path / "cal"
    out.mkdir(exist_ok=True)
    vol = ["-v", f"{out}:{out}", "-v", f"{pyz.parent}:{pyz.parent}:ro"] if mounts else []
    return docker(
        tmp_path, "run", "-d", "--name", f"cal{gpu}", *opts, *vol, "img", "python3", str(pyz),
        "--out", str(out / f"gpu{gpu}"), "--device", "cuda", "--gpu", "0", "--sections", "bandwidth,gemm",
    )  # fmt: skip


def wait_exit(tmp_path: Path, name: str) -> dict:
    for _ in range(300):
        state = json.loads((tmp_path / "docker" / "containers" / name / "state.json").read_text())
        if state["status"] == "exited":
            return state
        time.sleep(0.05)
    raise AssertionError(f"{name} did not exit")


def test_calibration_replays_a_gpu_and_the_plant_file_slows_one(tmp_path: Path, calib_pyz: Path) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "gpu_plant.json").write_text(json.dumps({"5": {"bandwidth": 0.8}}))
    for gpu in (4, 5):
        assert calib_run(tmp_path, calib_pyz, gpu, "--gpus", f"device={gpu}").returncode == 0
    docs = {}
    for gpu in (4, 5):
        state = wait_exit(tmp_path, f"cal{gpu}")
        log = Path(state["log"]).read_text()
        assert state["exit_code"] == 0, log
        assert "[calibrate] bandwidth ... (replayed)" in log
        docs[gpu] = json.loads((tmp_path / "cal" / f"gpu{gpu}" / "profile.json").read_text())
    assert docs[4]["device"] == "cuda" and docs[4]["from_base"]["profile"] == "h200"
    assert "no GPU ran" in docs[4]["environment"]["rig_shim"]
    assert "plant file" in docs[5]["environment"]["rig_shim"]
    read4, read5 = (docs[g]["measured"]["mem_read_bytes_per_s"] for g in (4, 5))
    gemm4, gemm5 = (docs[g]["measured"]["gemm_bf16_prefill_flops_per_s"] for g in (4, 5))
    assert read5 == pytest.approx(0.8 * read4) and gemm5 == pytest.approx(gemm4)


def test_calibration_without_gpus_or_mounts_fails_like_the_container(tmp_path: Path, calib_pyz: Path) -> None:
    assert calib_run(tmp_path, calib_pyz, 1).returncode == 0  # no --gpus: CUDA sees nothing
    state = wait_exit(tmp_path, "cal1")
    assert state["exit_code"] == 2
    assert "--device cuda: no CUDA device visible" in Path(state["log"]).read_text()
    assert calib_run(tmp_path, calib_pyz, 2, "--gpus", "device=2", mounts=False).returncode == 0
    state = wait_exit(tmp_path, "cal2")
    assert state["exit_code"] == 2 and "can't open file" in Path(state["log"]).read_text()
    assert not (tmp_path / "cal" / "gpu2" / "profile.json").exists()


def test_nvidia_smi_shim_lists_gpus_as_csv_and_refuses_a_split_query() -> None:
    smi = [sys.executable, str(Path(__file__).with_name("nvidia_smi_shim.py"))]
    ok = subprocess.run(
        [*smi, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.splitlines() == [f"{i}, NVIDIA H200" for i in range(8)]
    split = subprocess.run(
        [*smi, "--query-gpu=index", "name", "--format=csv", "noheader"], capture_output=True
    )
    assert split.returncode != 0
