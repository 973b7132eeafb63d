"""gpu_health: a slow GPU fails the gate naming its node, index and figure; nothing unjudgeable passes.

The profiles are the real H200 profile that `python -m enginesim.calibrate` wrote on a device
(enginesim/data/measured/h200/profile.json), copied per GPU and, for the planted GPU, scaled.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible.module_utils.gpu_fleet import GateInputError, judge_fleet, verdict_message

REPO = Path(__file__).resolve().parents[2]
H200 = json.loads((REPO / "enginesim" / "data" / "measured" / "h200" / "profile.json").read_text())
READ = "mem_read_bytes_per_s"
GEMM = "gemm_bf16_prefill_flops_per_s"


def profile(read: float = 1.0, gemm: float = 1.0, device: str = "cuda", name: str | None = None) -> dict:
    doc = copy.deepcopy(H200)
    doc["measured"][READ] *= read
    doc["measured"][GEMM] *= gemm
    doc["device"] = device
    if name:
        doc["environment"]["device_name"] = name
    return doc


def record(host: str, gpu: str, doc: dict | None, exit_code: object = 0, **kw: object) -> dict:
    return {
        "host": host,
        "gpu": gpu,
        "profile": doc,
        "exit_code": exit_code,
        "error": None,
        "log_tail": [],
        **kw,
    }


def fleet(planted: dict[tuple[str, str], dict] | None = None) -> list[dict]:
    """Two nodes x 8 GPUs of identical H200 profiles, with `planted` replacing some."""
    planted = planted or {}
    return [
        record(h, str(g), planted.get((h, str(g)), profile())) for h in ("head", "worker") for g in range(8)
    ]


def test_healthy_fleet_passes_with_medians():
    v = judge_fleet(fleet(), 0.10, 0.35)
    assert v["passed"] and v["gated"] == 16 and not v["failures"]
    group = v["fleet"]["NVIDIA H200"]
    assert group["gpus"] == 16 and group["hosts"] == ["head", "worker"]
    assert group["median_" + READ] == pytest.approx(H200["measured"][READ])
    msg = verdict_message(v, 0.10, 0.35)
    assert "16 NVIDIA H200 on 2 node(s) pass" in msg and "HBM read median 4.39 TB/s" in msg


def test_slow_bandwidth_fails_naming_node_gpu_and_figure():
    v = judge_fleet(fleet({("worker", "5"): profile(read=0.8)}), 0.10, 0.35)
    assert not v["passed"]
    assert v["failures"] == [
        "worker GPU 5: HBM read 3.51 TB/s is 20.0% below the fleet median 4.39 TB/s of 16 NVIDIA H200 "
        "(tolerance 10%)"
    ]
    bad = [r for r in v["rows"] if r["state"] == "fail"]
    assert [(r["host"], r["gpu"]) for r in bad] == [("worker", "5")]
    assert bad[0]["vs_median_" + READ] == pytest.approx(0.8)
    msg = verdict_message(v, 0.10, 0.35)
    assert msg.startswith("GPU health gate failed closed (rule: every GPU's HBM read bandwidth")
    assert "worker GPU 5: HBM read" in msg


def test_tolerance_boundary():
    """9% below the median passes a 10% tolerance; 11% below fails it."""
    assert judge_fleet(fleet({("head", "0"): profile(gemm=0.91)}), 0.10, 0.35)["passed"]
    v = judge_fleet(fleet({("head", "0"): profile(gemm=0.89)}), 0.10, 0.35)
    assert not v["passed"] and v["failures"][0].startswith("head GPU 0: bf16 GEMM 670 TFLOP/s is 11.0% below")
    assert judge_fleet(fleet({("head", "0"): profile(gemm=0.89)}), 0.12, 0.35)["passed"]


def test_whole_fleet_below_datasheet_fails_every_gpu():
    """The fleet median cannot catch a fleet that is uniformly slow; the datasheet margin does."""
    v = judge_fleet([record("head", str(g), profile(gemm=0.8)) for g in range(8)], 0.10, 0.35)
    assert not v["passed"] and len(v["failures"]) == 8
    assert (
        "bf16 GEMM 602 TFLOP/s is 39.1% below the datasheet 989 TFLOP/s (h200; margin 35%)"
        in v["failures"][0]
    )
    assert judge_fleet([record("head", str(g), profile(gemm=0.8)) for g in range(8)], 0.10, 0.40)["passed"]


def test_fleet_groups_by_gpu_model():
    """A slower model is compared with its own kind, not branded sick by a faster model's median."""
    recs = [record("head", str(g), profile()) for g in range(4)]
    recs += [record("worker", str(g), profile(read=0.7, gemm=0.9, name="NVIDIA H100")) for g in range(4)]
    v = judge_fleet(recs, 0.10, 0.40)
    assert v["passed"], v["failures"]
    assert set(v["fleet"]) == {"NVIDIA H200", "NVIDIA H100"}


def test_missing_profile_fails_closed_quoting_the_log():
    recs = fleet()
    recs[3] = record(
        "head", "3", None, exit_code=2, error="/x/profile.json does not exist",
        log_tail=["[calibrate] gemm ...",
                  "python -m enginesim.calibrate: error: --device cuda: no CUDA device visible"],
    )  # fmt: skip
    v = judge_fleet(recs, 0.10, 0.35)
    assert not v["passed"]
    assert v["failures"] == [
        "head GPU 3: no profile (/x/profile.json does not exist; exit 2; log: python -m enginesim.calibrate: "
        "error: --device cuda: no CUDA device visible)"
    ]


def test_nonzero_exit_with_profile_fails():
    recs = fleet()
    recs[0]["exit_code"] = 1
    recs[0]["log_tail"] = ["SECTION attention FAILED: RuntimeError: CUDA error"]
    v = judge_fleet(recs, 0.10, 0.35)
    assert v["failures"] == [
        "head GPU 0: calibration exited with 1 (SECTION attention FAILED: RuntimeError: CUDA error)"
    ]


def test_missing_figure_and_timeout_fail():
    doc = profile()
    doc["measured"][GEMM] = None
    recs = fleet({("head", "1"): doc})
    recs[2]["exit_code"] = "timeout"
    v = judge_fleet(recs, 0.10, 0.35)
    assert "head GPU 1: bf16 GEMM: no figure in the profile (section failed or not run)" in v["failures"]
    assert "head GPU 2: calibration exited with timeout" in v["failures"]


def test_cpu_profile_is_never_judged_as_a_gpu():
    cpu = record("localhost", "cpu", profile(device="cpu", name="CPU (x86_64)"))
    v = judge_fleet([cpu], 0.10, 0.35, expect_device="cpu")
    assert v["passed"] and v["gated"] == 0 and v["not_gated"] == 1 and v["fleet"] == {}
    assert verdict_message(v, 0.10, 0.35) == (
        "no GPU judged; 1 CPU profile(s) recorded, not gated (a CPU figure is never judged as a GPU)"
    )
    v = judge_fleet([*fleet(), {**cpu, "host": "head", "gpu": "7"}][1:], 0.10, 0.35, expect_device="cuda")
    assert not v["passed"]
    assert v["failures"] == [
        "head GPU 7: device=cpu where a GPU was expected (a CPU figure is never judged as a GPU)"
    ]


def test_single_gpu_says_the_fleet_comparison_is_vacuous():
    v = judge_fleet([record("head", "0", profile())], 0.10, 0.35)
    assert v["passed"] and "one GPU: the fleet comparison says nothing" in verdict_message(v, 0.10, 0.35)


def test_no_results_fail():
    v = judge_fleet([], 0.10, 0.35)
    assert not v["passed"] and "no calibration result" in v["failures"][0]


@pytest.mark.parametrize(
    ("tol", "margin", "device", "needle"),
    [
        (1.0, 0.35, "cuda", "tolerance=1.0"),
        (-0.1, 0.35, "cuda", "tolerance=-0.1"),
        (0.1, float("nan"), "cuda", "datasheet_margin=nan"),
        (0.1, 0.35, "gpu", "expect_device='gpu'"),
    ],
)
def test_bad_settings_are_refused(tol, margin, device, needle):
    with pytest.raises(GateInputError, match=needle):
        judge_fleet(fleet(), tol, margin, device)


def test_bad_gpu_id_is_refused():
    with pytest.raises(GateInputError, match="gpu='0; rm'"):
        judge_fleet([record("head", "0; rm", profile())], 0.1, 0.35)


# ------------------------------------------------------------------------------- the module itself


def write_gpu(base: Path, host: str, gpu: str, doc: dict | None, exit_code: str = "0", log: str = "") -> dict:
    d = base / host / (f"gpu{gpu}" if gpu != "cpu" else "cpu")
    d.mkdir(parents=True)
    if doc is not None:
        (d / "profile.json").write_text(json.dumps(doc))
    (d / "exit_code").write_text(exit_code + "\n")
    (d / "calibrate.log").write_text(log)
    return {"host": host, "gpu": gpu, "dir": str(d)}


def test_module_fails_on_planted_gpu_and_writes_dest(run, tmp_path):
    results = [
        write_gpu(tmp_path, h, str(g), profile(read=0.5 if (h, g) == ("worker", 2) else 1.0))
        for h in ("head", "worker")
        for g in range(4)
    ]
    dest = tmp_path / "gate.json"
    kind, res = run("gpu_health", {"results": results, "dest": str(dest)})
    assert kind == "fail" and res["changed"] is False and res["dest_written"] is True
    assert "worker GPU 2: HBM read 2.19 TB/s is" in res["msg"] and "below the fleet median" in res["msg"]
    assert "below the datasheet 4.8 TB/s" in res["msg"]
    saved = json.loads(dest.read_text())
    assert saved["schema"] == "quickmap.gpu_health/1" and saved["passed"] is False
    assert saved["failures"] == res["failures"]


def test_module_missing_dir_fails_and_check_mode_writes_nothing(run, tmp_path):
    results = [
        write_gpu(tmp_path, "head", "0", profile()),
        {"host": "head", "gpu": "1", "dir": str(tmp_path / "nope")},
    ]
    dest = tmp_path / "gate.json"
    kind, res = run("gpu_health", {"results": results, "dest": str(dest)}, check_mode=True)
    assert kind == "fail" and res["dest_written"] is False and not dest.exists()
    assert f"head GPU 1: no profile ({tmp_path}/nope/profile.json does not exist; exit None)" in res["msg"]


def test_module_cpu_run_is_recorded_not_gated(run, tmp_path):
    results = [write_gpu(tmp_path, "localhost", "cpu", profile(device="cpu"))]
    kind, res = run("gpu_health", {"results": results, "expect_device": "cpu"})
    assert kind == "exit" and res["gated"] == 0 and res["not_gated"] == 1
    assert res["rows"][0]["state"] == "not_gated"


def test_module_refuses_malformed_entry(run, tmp_path):
    kind, res = run("gpu_health", {"results": [{"host": "head", "gpu": "0"}]})
    assert kind == "fail" and "rule: a dict with host, gpu and dir" in res["msg"]
