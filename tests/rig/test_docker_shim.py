"""The rig's docker shim on its own (no namespaces): argv recording, option parsing, daemon-side errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
