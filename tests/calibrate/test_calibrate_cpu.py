"""`python -m enginesim.calibrate` end to end on this machine's CPU (tiny shapes), as CI runs it.

torch comes from the `calibrate` extra that `make venv` installs (pyproject.toml); without it this
module fails at import, on purpose: a calibration test that quietly skipped would prove nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (the calibrate extra; see the module docstring)

from enginesim import cli, hwprofile
from enginesim.calibrate import compare
from enginesim.calibrate import profile as calprofile
from enginesim.calibrate.plan import Dims

REPO = Path(__file__).resolve().parents[2]
SECTIONS = {"bandwidth", "gemm", "attention", "launch", "model"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginesim.calibrate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("calib") / "cpu"
    return out, _run("--out", str(out))


def test_cpu_run_writes_a_cpu_profile_and_raw_results(cpu_run) -> None:
    out, r = cpu_run
    assert r.returncode == 0, r.stderr
    raw_text = (out / "raw.json").read_text()
    raw = json.loads(raw_text)
    doc = json.loads((out / "profile.json").read_text())
    assert raw["device"] == doc["device"] == "cpu"
    assert raw["plan"]["name"] == "cpu-tiny"
    assert raw["plan"]["model"]["shrunk"] is True
    assert set(raw["sections"]) == SECTIONS and raw["errors"] == {}
    hwprofile.validate(doc)
    assert doc["raw_sha256"] == calprofile.sha256(raw_text)
    assert doc["profile"]["key"] == "cpu-measured"
    # a CPU has no datasheet here: its measured rates are its peaks, and the file says so
    assert doc["profile"]["eff_compute"] == doc["profile"]["eff_memory"] == 1.0
    assert doc["profile"]["mem_bw"] == doc["measured"]["mem_read_bytes_per_s"] > 0
    assert {"peak_flops", "mem_bw"} <= set(doc["measured_fields"])
    assert "device: CPU" in r.stdout and "decode B=" in r.stdout


def test_cpu_run_measures_every_figure_with_its_statistic(cpu_run) -> None:
    out, _ = cpu_run
    raw = json.loads((out / "raw.json").read_text())
    sec = raw["sections"]
    gemm = sec["gemm"]
    plan = raw["plan"]
    assert {(g["phase"], g["m"]) for g in gemm if g["dtype"] == "bf16"} >= {
        *(("decode", m) for m in plan["gemm_decode_m"]),
        *(("prefill", m) for m in plan["gemm_prefill_m"]),
    }
    shapes = {name: (n, k) for name, n, k in Dims(**plan["gemm"]).gemms()}
    shapes["square"] = (plan["square"], plan["square"])
    for g in gemm:
        assert (g["n"], g["k"]) == shapes[g["gemm"]]  # the GEMM's N, not overwritten by the run count
        if g["dtype"] == "bf16":
            assert g["statistic"] == "median" and g["runs"] == plan["reps"] and g["flops_per_s"] > 0
    assert {a["context"] for a in sec["attention"]} == set(plan["attn_contexts"])
    assert {a["phase"] for a in sec["attention"]} == {"decode", "prefill"}
    assert sec["launch"]["eager"]["per_kernel_s"] > 0
    assert sec["launch"]["graph"] == {"skipped": "CUDA graphs need a CUDA device"}
    decode = sec["model"]["decode"]["rows"]
    assert [r["batch"] for r in decode if r["cuda_graph_requested"]] == plan["decode_batches"]
    assert all(r["median_s"] > 0 and r["cuda_graph"] is False for r in decode)
    assert [p["prompt_tokens"] for p in sec["model"]["prefill"]] == plan["prefill_lens"]
    assert raw["model_omits"].startswith("no rotary embedding")


def test_cpu_profile_is_not_accepted_as_a_gpu_profile(cpu_run, capsys) -> None:
    out, _ = cpu_run
    path = str(out / "profile.json")
    with pytest.raises(SystemExit):
        cli.parse(["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--sim-hardware-file", path], env={})
    assert "refused as a GPU profile" in capsys.readouterr().err
    cfg = cli.parse(
        ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--sim-hardware-file", path, "--sim-allow-cpu-profile"],
        env={},
    )
    assert cfg.sim.hw_override["key"] == "cpu-measured"


def test_compare_refuses_cpu_shapes(cpu_run) -> None:
    out, _ = cpu_run
    raw = json.loads((out / "raw.json").read_text())
    doc = json.loads((out / "profile.json").read_text())
    with pytest.raises(ValueError, match="shrunk"):
        compare.table([raw], doc)


def test_existing_results_are_never_overwritten(cpu_run) -> None:
    out, _ = cpu_run
    before = (out / "profile.json").read_bytes()
    r = _run("--out", str(out), "--sections", "launch")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert (out / "profile.json").read_bytes() == before


def test_sections_only_write_raw_results(tmp_path: Path) -> None:
    r = _run("--out", str(tmp_path / "o"), "--sections", "launch,bandwidth", "--quick")
    assert r.returncode == 0, r.stderr
    assert "raw.json only" in r.stdout
    assert not (tmp_path / "o" / "profile.json").exists()
    raw = json.loads((tmp_path / "o" / "raw.json").read_text())
    assert set(raw["sections"]) == {"launch", "bandwidth"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sections", "gemm,warp"], "--sections 'gemm,warp': must be a comma list"),
        (["--base", "b300"], "--base 'b300': must be one of"),
        (["--model", "deepseek-ai/DeepSeek-V3"], "dense GQA decoders only"),
        (["--model", "no/such-model"], "error: model"),
        (["--device", "cuda"], "--device cuda: no CUDA device visible"),
        (["--key", "a b"], "--key 'a b'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    tmp_path: Path, args: list[str], message: str
) -> None:
    r = _run("--out", str(tmp_path / "o"), *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert not (tmp_path / "o" / "raw.json").exists()
