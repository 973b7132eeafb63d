"""quant_matrix and tp_scaling through their real command (`ansible-playbook labs.yml`) on enginesim.

SGLang flavour as configured; vLLM flavour with a planted FP8 fallback (vLLM's own switch
VLLM_TEST_FORCE_FP8_MARLIN=1 in the lab's server environment): the fp8 variant must come out as a
fallback, "not comparable", never as FP8. tp_scaling runs three TP sizes and two rates here (the
defaults are four and five) to keep the playbook runs to minutes on the shared box.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from labs_helpers import DEFAULTS, REPO
from test_labs_check_mode import playbook
from test_labs_enginesim import fail_text, run_labs

sys.path.insert(0, str(REPO))
from analysis.labs import tp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
LABS = ("quant_matrix", "tp_scaling")
# the embedded inventory's per-lab server environments (time scales)
LOCAL_LAB_ENV = yaml.safe_load((REPO / "inventory/local/group_vars/all.yml").read_text())[
    "labs_lab_engine_env"
]


def _workloads() -> dict:
    w = copy.deepcopy(DEFAULTS["labs_workloads"])
    w["tp_scaling"].update(rates=[10, 100], num_prompts=30)
    return w


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def advlabs(request, tmp_path_factory) -> dict:
    engine = request.param
    tmp = tmp_path_factory.mktemp(f"advlabs_{engine}")
    extra = {"labs_workloads": _workloads(), "labs_tp_sizes": [1, 2, 8], "labs_tp_dp_size": 2}
    if engine == "vllm":
        # the inventory's per-lab environments (tp_scaling's, quant_matrix's time scales) kept, the planted
        # fallback added
        extra["labs_lab_engine_env"] = LOCAL_LAB_ENV | {
            "quant_matrix": LOCAL_LAB_ENV["quant_matrix"] | {"VLLM_TEST_FORCE_FP8_MARLIN": "1"}
        }
    proc, labs_dir = run_labs(tmp, engine, ",".join(LABS), f"adv_{engine}", **extra)
    assert proc.returncode == 0, fail_text(proc)
    docs = {lab: json.loads((labs_dir / lab / "lab.json").read_text()) for lab in LABS}
    return {"engine": engine, "dir": labs_dir, "docs": docs}


def test_quant_matrix_reads_each_variants_kernel_from_its_log_and_never_passes_a_fallback(advlabs) -> None:
    doc = advlabs["docs"]["quant_matrix"]
    fig = doc["figures"]["variants"]
    assert doc["emulated"] and doc["reason"].startswith("emulated: ")
    for name, model in DEFAULTS["labs_quant_models"].items():
        cmd = (
            advlabs["dir"] / "quant_matrix" / name / "server" / "localhost.start1_server_cmd.txt"
        ).read_text()
        assert model in cmd, name
        assert f"export ENGINESIM_TIME_SCALE={LOCAL_LAB_ENV['quant_matrix']['ENGINESIM_TIME_SCALE']}\n" in cmd
        assert fig[name]["model"] == model
        assert fig[name]["accuracy"]["status"] == "not measured (emulated engine)"
        assert fig[name]["accuracy"]["scores"] == {}
    assert fig["awq_int4"]["kernel"]["kernel"] == "awq_marlin"
    assert fig["gptq_int4"]["kernel"]["kernel"] == "gptq_marlin"
    w = {n: fig[n]["memory"]["weights_gib_from_log"] for n in fig}
    assert w["awq_int4"] < w["fp8"] < w["bf16"]
    comps = {c["treatment"]: c for c in doc["comparisons"]}
    for name in ("awq_int4", "gptq_int4"):
        assert comps[name]["verdict"] == "supported", comps[name]
    if advlabs["engine"] == "sglang":
        assert fig["fp8"]["served"]["status"] == "as requested" and fig["fp8"]["kernel"]["fallback"] is None
        assert doc["verdict"] == "supported", doc["reason"]
    else:  # the planted fallback
        assert fig["fp8"]["served"]["status"] == "fallback"
        assert fig["fp8"]["comparable"] is False
        assert comps["fp8"]["verdict"] == "inconclusive" and "not comparable" in comps["fp8"]["reason"]
        assert doc["verdict"] == "inconclusive"
        assert any("FALLBACK" in p for p in doc["pitfalls"])
        log = (advlabs["dir"] / "quant_matrix" / "fp8" / "server" / "localhost.start1.log").read_text()
        assert "Weight-only FP8 compression will be used leveraging the Marlin kernel" in log


def test_tp_scaling_efficiency_is_computed_from_the_runs_and_the_trace_shows_the_all_reduce(advlabs) -> None:
    doc = advlabs["docs"]["tp_scaling"]
    vs = doc["figures"]["variants"]
    assert [vs[n]["tp"] for n in ("tp1", "tp2", "tp8")] == [1, 2, 8]
    cmd = (advlabs["dir"] / "tp_scaling" / "tp8" / "server" / "localhost.start1_server_cmd.txt").read_text()
    assert ("--tp-size 8" if advlabs["engine"] == "sglang" else "--tensor-parallel-size 8") in cmd
    base = {r["rate"]: r["output_tok_s"] for r in vs["tp1"]["rates"]}
    for name, v in vs.items():
        for row in v["rates"] if v["dp"] == 1 else []:
            want = tp.efficiency(row["output_tok_s"], v["tp"], base[row["rate"]])
            assert doc["figures"]["efficiency"][name][str(row["rate"])] == pytest.approx(want, abs=1e-4)
        assert v["trace"]["status"] == "read", v["trace"]
        traces = list((advlabs["dir"] / "tp_scaling" / name).glob("runs/r100/trace/*.trace.json.gz"))
        assert len(traces) == 1
    shares = [vs[n]["trace"]["summary"]["shares"]["nccl"] for n in ("tp1", "tp2", "tp8")]
    assert shares[0] == 0 and 0 < shares[1] < shares[2]
    assert doc["verdict"] == "supported", doc["reason"]
    # the DP point: two replicas at TP=1 in one server, against TP=2, its ratio computed from the runs
    cmd = (advlabs["dir"] / "tp_scaling" / "dp2" / "server" / "localhost.start1_server_cmd.txt").read_text()
    assert ("--dp-size 2" if advlabs["engine"] == "sglang" else "--data-parallel-size 2") in cmd
    assert (vs["dp2"]["tp"], vs["dp2"]["dp"], vs["dp2"]["gpus"]) == (1, 2, 2)
    point = doc["figures"]["dp_vs_tp"]["dp2"]
    assert point["against"] == "tp2" and [r["rate"] for r in point["rates"]] == [10, 100]
    tp2 = {r["rate"]: r["output_tok_s"] for r in vs["tp2"]["rates"]}
    for dp_row, row in zip(vs["dp2"]["rates"], point["rates"], strict=True):
        want = tp.dp_ratio(dp_row["output_tok_s"], tp2[row["rate"]])
        assert row["dp_over_tp_output_tok_s"] == pytest.approx(want, abs=1e-4)
    assert any(o.startswith("DP=2 replicas at TP=1 vs TP=2") for o in doc["observations"])


def test_check_prints_every_format_and_every_tp_size(tmp_path) -> None:
    for engine in ("sglang", "vllm"):
        proc = playbook(
            tmp_path, "--check", "--tags", "quant_matrix,tp_scaling", engine_name=engine, run_id="d"
        )
        out = proc.stdout
        assert proc.returncode == 0, out[-3000:]
        for model in DEFAULTS["labs_quant_models"].values():
            assert model in out
        for method in ("fp8", "awq_marlin", "gptq_marlin"):
            assert f"--quantization {method}" in out
        flag = "--tp-size" if engine == "sglang" else "--tensor-parallel-size"
        for n in DEFAULTS["labs_tp_sizes"]:
            assert f"{flag} {n}" in out
        dp_flag = "--dp-size" if engine == "sglang" else "--data-parallel-size"
        assert f"{dp_flag} {DEFAULTS['labs_tp_dp_size']}" in out
        assert not (tmp_path / "results" / ".state").exists()
