"""Hardware-profile files: schema checks, --sim-hardware-file / ENGINESIM_HARDWARE_FILE, CPU refusal.

Standard library only (no torch): this is the emulator's side of the calibration.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from calib_helpers import engines, free_port, ready_info

from enginesim import catalog, cli, hwprofile
from enginesim.calibrate import compare
from enginesim.calibrate import profile as calprofile

ARGS = ["sglang", "--model-path", "Qwen/Qwen3-0.6B"]


def _hw(argv: list[str], env: dict[str, str] | None = None) -> catalog.Hardware:
    cfg = cli.parse(argv, env=env or {})
    return catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(SystemExit) as ei:
        cli.parse(argv, env=env or {})
    assert ei.value.code == 2
    return capsys.readouterr().err


def _write(tmp_path: Path, doc: Any, name: str = "p.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_measured_h200_profile_loads_by_flag_and_env(measured_dir: Path) -> None:
    path = str(measured_dir / "profile.json")
    doc = json.loads(Path(path).read_text())
    for hw in (_hw([*ARGS, "--sim-hardware-file", path]), _hw(ARGS, {"ENGINESIM_HARDWARE_FILE": path})):
        assert hw.key == "h200-measured"
        assert hw.eff_memory == doc["profile"]["eff_memory"]
        assert hw.eff_compute == doc["profile"]["eff_compute"]
        assert hw.mem_bytes == doc["profile"]["mem_bytes"]
        assert hw.overheads["graph_replay"] == doc["profile"]["overheads_s"]["graph_replay"]
    stock = catalog.load_hardware("h200")
    assert hw.eff_memory != stock.eff_memory


def test_hw_json_still_overrides_a_profile_file(measured_dir: Path) -> None:
    path = str(measured_dir / "profile.json")
    hw = _hw([*ARGS, "--sim-hardware-file", path, "--sim-hw-json", '{"mem_bytes": 24e9}'])
    assert hw.key == "h200-measured"
    assert hw.mem_bytes == 24e9


def test_committed_profile_matches_its_raw_measurements(measured_dir: Path) -> None:
    """The committed profile is what `build` derives from the committed raw.json (nothing hand-edited)."""
    raw_text = (measured_dir / "raw.json").read_text()
    doc = json.loads((measured_dir / "profile.json").read_text())
    assert doc["raw_sha256"] == calprofile.sha256(raw_text)
    rebuilt = calprofile.build(json.loads(raw_text), doc["from_base"]["profile"])
    assert rebuilt["profile"] == doc["profile"]
    assert doc["device"] == "cuda"
    assert doc["environment"]["device_name"] == "NVIDIA H200"


def test_cpu_profile_is_refused_unless_allowed(tmp_path: Path, measured_dir: Path, capsys) -> None:
    doc = json.loads((measured_dir / "profile.json").read_text())
    doc["device"] = "cpu"
    path = _write(tmp_path, doc)
    err = _refused([*ARGS, "--sim-hardware-file", path], capsys)
    assert "device='cpu'" in err and "refused as a GPU profile" in err and path in err
    err = _refused(ARGS, capsys, {"ENGINESIM_HARDWARE_FILE": path})
    assert "ENGINESIM_ALLOW_CPU_PROFILE" in err
    assert _hw([*ARGS, "--sim-hardware-file", path, "--sim-allow-cpu-profile"]).key == "h200-measured"
    env = {"ENGINESIM_HARDWARE_FILE": path, "ENGINESIM_ALLOW_CPU_PROFILE": "1"}
    assert _hw(ARGS, env).key == "h200-measured"


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda d: d.update(schema="x/2"), "schema='x/2'"),
        (lambda d: d.update(device="tpu"), "device='tpu'"),
        (lambda d: d["profile"].update(eff_memory=2.2), "profile.eff_memory=2.2"),
        (lambda d: d["profile"].update(eff_compute=0), "profile.eff_compute=0"),
        (lambda d: d["profile"].update(mem_bw="fast"), "profile.mem_bw='fast'"),
        (lambda d: d["profile"].update(peak_flops=-1), "profile.peak_flops=-1"),
        (lambda d: d["profile"].update(gpus_per_node=0), "profile.gpus_per_node=0"),
        (lambda d: d["profile"].pop("mem_bytes"), "profile.mem_bytes=None"),
        (lambda d: d["profile"]["overheads_s"].update(graph_replay=-1e-6), "overheads_s.graph_replay=-1e-06"),
        (lambda d: d["profile"]["overheads_s"].pop("kernel_launch"), "overheads_s.kernel_launch=None"),
        (lambda d: d["profile"].update(key=""), "profile.key=''"),
    ],
)
def test_bad_profile_fields_are_refused_naming_field_and_value(
    tmp_path: Path, measured_dir: Path, capsys, edit, expect: str
) -> None:
    doc = copy.deepcopy(json.loads((measured_dir / "profile.json").read_text()))
    edit(doc)
    err = _refused([*ARGS, "--sim-hardware-file", _write(tmp_path, doc)], capsys)
    assert expect in err and "must be" in err


def test_unreadable_profiles_are_refused(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "nope.json")
    assert "cannot read the hardware profile" in _refused([*ARGS, "--sim-hardware-file", missing], capsys)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not a JSON document" in _refused([*ARGS, "--sim-hardware-file", str(bad)], capsys)
    assert "a JSON object" in _refused([*ARGS, "--sim-hardware-file", _write(tmp_path, [1, 2])], capsys)


def test_profile_file_and_hardware_key_together_are_refused(measured_dir: Path, capsys) -> None:
    path = str(measured_dir / "profile.json")
    err = _refused([*ARGS, "--sim-hardware", "h100", "--sim-hardware-file", path], capsys)
    assert "give one" in err
    err = _refused([*ARGS, "--sim-hardware-file", path], capsys, {"ENGINESIM_HARDWARE": "h100"})
    assert "give one" in err


def test_validate_accepts_exactly_what_build_writes() -> None:
    raw = {
        "device": "cuda",
        "env": {"device_name": "NVIDIA H200", "total_memory_bytes": 150e9},
        "plan": {"reps": 3},
        "sections": {
            "bandwidth": {"read": {"bytes_per_s": 4.0e12}, "copy": {"bytes_per_s": 3.9e12}},
            "gemm": [
                {"phase": "prefill", "dtype": "bf16", "m": 4096, "flops": 6e11, "median_s": 1e-3},
                {"phase": "prefill", "dtype": "bf16", "m": 4096, "flops": 2e11, "median_s": 1e-3},
                {"phase": "prefill", "dtype": "bf16", "m": 16384, "flops": 1e12, "median_s": 1e-2},
            ],
            "launch": {
                "eager": {"per_kernel_s": 5e-6},
                "sync_roundtrip": {"median_s": 3e-6},
                "graph": {"one_kernel_wall": {"median_s": 10e-6}, "many_device": {"per_kernel_s": 1e-6}},
            },
        },
    }
    doc = calprofile.build(raw, "h200")
    prof = hwprofile.validate(doc)
    assert prof["peak_flops"] == 989e12 and prof["mem_bw"] == 4.8e12
    assert prof["eff_compute"] == pytest.approx(8e11 / 2e-3 / 989e12)
    assert prof["eff_memory"] == pytest.approx(4.0e12 / 4.8e12)
    assert prof["overheads_s"]["graph_replay"] == pytest.approx(7e-6)
    assert prof["overheads_s"]["kernel_launch"] == 5e-6
    assert "overheads_s.kernel_floor" in doc["from_base"]["fields"]
    assert "intra_node_bw" in doc["from_base"]["fields"]
    # the same raw against a slower datasheet: bandwidth 2x the A100's is not an efficiency
    with pytest.raises(hwprofile.ProfileError, match=r"profile.eff_memory=1\.9"):
        calprofile.build(raw, "a100-80g")
    del raw["sections"]["gemm"]
    with pytest.raises(calprofile.IncompleteError, match="gemm"):
        calprofile.build(raw, "h200")


def test_base_profile_from_device_name() -> None:
    assert calprofile.base_for("NVIDIA H200") == "h200"
    assert calprofile.base_for("NVIDIA H100 80GB HBM3") == "h100"
    assert calprofile.base_for("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "rtx-pro-6000-server"
    assert calprofile.base_for("Some Future GPU") is None


def test_compare_prices_every_measured_step_with_both_profiles(measured_dir: Path) -> None:
    raws = [json.loads((measured_dir / n).read_text()) for n in ("raw.json", "llama8b-raw.json")]
    doc = json.loads((measured_dir / "profile.json").read_text())
    records = compare.table(raws, doc)
    measured_rows = sum(len(compare.rows_of(r)) for r in raws)
    assert len(records) == measured_rows >= 20
    for r in records:
        assert r["stock_s"] > r["stock_gpu_s"] > 0
        assert r["profile_s"] > r["profile_gpu_s"] > 0
    b1 = next(r for r in records if r["model"] == "Qwen/Qwen3-0.6B" and r["step"].startswith("decode B=1 "))
    assert b1["measured_s"] == pytest.approx(raws[0]["sections"]["model"]["decode"]["rows"][0]["median_s"])


@pytest.mark.slow
def test_engine_started_with_a_profile_file_reports_and_sizes_by_it(
    tmp_path: Path, measured_dir: Path
) -> None:
    """A real emulated SGLang server: /server_info names the measured profile, and its KV capacity
    follows the profile's memory (150.1 GB measured vs the datasheet's 141 GB)."""
    tokens = {}
    for label, extra in (
        ("stock", []),
        ("file", ["--sim-hardware-file", str(measured_dir / "profile.json")]),
    ):
        port = free_port()
        run = [*ARGS, "--host", "127.0.0.1", "--port", str(port), *extra]
        log_dir = tmp_path / label
        log_dir.mkdir()
        with engines([run], log_dir) as (proc,):
            info = ready_info(f"http://127.0.0.1:{port}", proc)
        tokens[label] = info["max_total_num_tokens"]
        assert info["enginesim"]["hardware"] == ("h200-measured" if label == "file" else "h200")
    assert tokens["file"] > tokens["stock"]
