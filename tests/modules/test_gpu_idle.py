"""gpu_idle: a stray GPU process stops the run; a host without nvidia-smi is reported, never passed silently.

A fake ``nvidia-smi`` shell script on a temporary PATH plays the real one. It refuses any other
arguments than the query the module must send, so a wrong flag fails the test.
"""

from __future__ import annotations

import os
import platform
import stat
from pathlib import Path

import pytest

QUERY_ARGS = "--query-compute-apps=pid,process_name,used_memory --format=csv,noheader"


def fake_nvidia_smi(bin_dir: Path, stdout: str = "", stderr: str = "", rc: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" != "{QUERY_ARGS}" ]; then echo "fake nvidia-smi: unexpected args: $*" >&2; exit 64; fi\n'
        f"cat <<'EOF'\n{stdout}EOF\n" + (f"cat >&2 <<'EOF'\n{stderr}EOF\n" if stderr else "") + f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    """A PATH holding only a private bin dir (plus /bin for sh and cat)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
    return bin_dir


def test_idle_gpus_pass(run, fake_path):
    fake_nvidia_smi(fake_path, stdout="")
    kind, res = run("gpu_idle", {})
    assert kind == "exit", res["msg"]
    assert res["gpus_idle"] is True and res["checked"] is True and res["processes"] == []
    assert res["nvidia_smi"] == str(fake_path / "nvidia-smi") and res["changed"] is False


def test_stray_process_fails_naming_pid_name_and_memory(run, fake_path):
    fake_nvidia_smi(
        fake_path,
        stdout="4242, python3, 71234 MiB\n5151, /usr/bin/sglang, worker, 1024 MiB\n",
    )
    kind, res = run("gpu_idle", {})
    assert kind == "fail"
    assert res["gpus_idle"] is False and res["checked"] is True
    assert "pid 4242 python3 (71234 MiB)" in res["msg"]
    assert "pid 5151 /usr/bin/sglang, worker (1024 MiB)" in res["msg"]
    assert platform.node() in res["msg"] and "rule:" in res["msg"]
    assert res["processes"][0] == {
        "pid": 4242,
        "name": "python3",
        "used_memory": "71234 MiB",
        "used_memory_mib": 71234,
    }


def test_nvidia_smi_error_rc_fails_with_rc_and_stderr(run, fake_path):
    fake_nvidia_smi(
        fake_path,
        stdout="",
        stderr="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        rc=9,
    )
    kind, res = run("gpu_idle", {})
    assert kind == "fail"
    assert res["rc"] == 9 and "couldn't communicate with the NVIDIA driver" in res["stderr"]
    assert "(rc=9)" in res["msg"] and "NVIDIA driver" in res["msg"]
    assert res["gpus_idle"] is None


def test_the_csv_header_line_is_tolerated(run, fake_path):
    """A capture without `noheader` (or a site wrapper) prints nvidia-smi's CSV header first."""
    fake_nvidia_smi(fake_path, stdout="pid, process_name, used_gpu_memory [MiB]\n")
    kind, res = run("gpu_idle", {})
    assert kind == "exit", res["msg"]
    assert res["gpus_idle"] is True and res["processes"] == []
    fake_nvidia_smi(fake_path, stdout="pid, process_name, used_gpu_memory [MiB]\n4242, python3, 1024 MiB\n")
    kind, res = run("gpu_idle", {})
    assert kind == "fail" and res["processes"][0]["pid"] == 4242
    # Only as the first line, and only that header: anything else unparsable is still refused.
    for text in (
        "4242, python3, 1024 MiB\npid, process_name, used_gpu_memory [MiB]\n",
        "pid, name, memory\n",
    ):
        fake_nvidia_smi(fake_path, stdout=text)
        kind, res = run("gpu_idle", {})
        assert kind == "fail" and res["checked"] is True and "unexpected nvidia-smi line" in res["msg"], text


def test_unreadable_output_is_not_mistaken_for_idle(run, fake_path):
    fake_nvidia_smi(fake_path, stdout="Field 'process_name' is not a valid field to query.\n")
    kind, res = run("gpu_idle", {})
    assert kind == "fail" and "unexpected nvidia-smi line" in res["msg"] and res["gpus_idle"] is None


def test_missing_nvidia_smi_fails_unless_allowed(run, fake_path):
    if any(Path(d, "nvidia-smi").exists() for d in ("/sbin", "/usr/sbin", "/usr/local/sbin")):
        pytest.skip("a real nvidia-smi is installed in an sbin directory")
    kind, res = run("gpu_idle", {})
    assert kind == "fail"
    assert res["msg"].startswith(f"nvidia-smi not found on {platform.node()}: cannot prove the GPUs are idle")
    assert res["checked"] is False and res["gpus_idle"] is None

    kind, res = run("gpu_idle", {"allow_missing": True})
    assert kind == "exit"
    assert res["gpus_idle"] is None and res["checked"] is False and "not found" in res["msg"]


def test_explicit_path_that_does_not_exist_is_missing(run, tmp_path):
    missing = str(tmp_path / "opt" / "nvidia-smi")
    kind, res = run("gpu_idle", {"nvidia_smi": missing})
    assert kind == "fail" and res["msg"].startswith(f"{missing} not found")


def test_explicit_path_is_used(run, tmp_path):
    script = fake_nvidia_smi(tmp_path / "opt", stdout="77, vllm, 10 MiB\n")
    kind, res = run("gpu_idle", {"nvidia_smi": str(script)}, check_mode=True)
    assert kind == "fail" and "pid 77 vllm (10 MiB)" in res["msg"]
