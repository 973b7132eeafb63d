"""quant_matrix without a server: enginesim's kernel selection, the kernel evidence read from real
engine logs, the plan, and the verdict's refusal to pass a fallback as the requested format."""

from __future__ import annotations

import copy
import sys

import pytest
from conftest import sample
from labs_helpers import DEFAULTS, REPO, config

sys.path.insert(0, str(REPO))
from analysis.errors import InputError
from analysis.evidence import quant as qev
from analysis.labs import plan as lab_plan
from analysis.labs import quant
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED
from enginesim import catalog, quantization

FIX = "quant_kernel_selection.txt"
H200 = catalog.load_hardware("h200")
A100 = catalog.load_hardware("a100-80g")
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}
FP8 = {"quant_method": "fp8", "bits": 8, "group_size": 0}


# ------------------------------------------------------------------ enginesim: kernels per architecture


def test_marlin_is_chosen_for_int4_checkpoints_on_sm80_and_newer() -> None:
    for hw in (H200, A100):
        sel = quantization.select("awq_marlin", AWQ, quantization.capability(hw), "vllm", {})
        assert (sel.method, sel.kernel, sel.fallback) == ("awq_marlin", "marlin_int4", False)
        assert "Using awq_marlin kernel" in sel.lines[0].text
    sel = quantization.select(None, GPTQ, 90, "sglang", {})
    assert sel.method == "gptq_marlin" and "convertible to gptq_marlin" in sel.lines[0].text


def test_marlin_needs_sm80_and_the_engine_refuses_it_below() -> None:
    with pytest.raises(quantization.QuantError, match=r"Minimum capability: 80\. Current capability: 75"):
        quantization.select("awq_marlin", AWQ, 75, "vllm", {})


def test_fp8_is_native_only_where_the_gpu_has_fp8_and_falls_back_to_marlin_elsewhere() -> None:
    native = quantization.select("fp8", FP8, 90, "vllm", {})
    assert (native.kernel, native.fallback) == ("fp8_native", False)
    assert any("CutlassFP8ScaledMMLinearKernel" in ln.text for ln in native.lines)
    old = quantization.select("fp8", FP8, 80, "vllm", {})
    assert (old.kernel, old.fallback) == ("fp8_marlin", True)
    assert any("Weight-only FP8 compression" in ln.text and ln.level == "WARNING" for ln in old.lines)


@pytest.mark.parametrize(
    ("flavour", "env"),
    [("vllm", {"VLLM_TEST_FORCE_FP8_MARLIN": "1"}), ("sglang", {"SGLANG_FORCE_FP8_MARLIN": "1"})],
)
def test_each_engines_real_switch_plants_the_fp8_marlin_fallback_on_hopper(flavour, env) -> None:
    sel = quantization.select("fp8", FP8, 90, flavour, env)
    assert sel.fallback and sel.kernel == "fp8_marlin"
    # the other engine's switch does nothing
    other = {"VLLM_TEST_FORCE_FP8_MARLIN": "1"} if flavour == "sglang" else {"SGLANG_FORCE_FP8_MARLIN": "1"}
    assert not quantization.select("fp8", FP8, 90, flavour, other).fallback


def test_explicit_plain_awq_runs_the_slow_kernel_and_says_so() -> None:
    sel = quantization.select("awq", AWQ, 90, "vllm", {})
    assert sel.kernel == "awq_gemm" and not sel.fallback
    assert "so forcing awq" in sel.lines[0].text and "not fully optimized" in sel.lines[1].text


def test_a_method_the_checkpoint_does_not_hold_is_refused_at_start() -> None:
    with pytest.raises(quantization.QuantError, match="Cannot find the config file for awq_marlin"):
        quantization.select("awq_marlin", None, 90, "vllm", {})
    with pytest.raises(quantization.QuantError, match=r"model config \(gptq\) does not match"):
        quantization.select("awq_marlin", GPTQ, 90, "vllm", {})
    # online FP8 of a 16-bit checkpoint is a real engine feature: accepted
    assert quantization.select("fp8", None, 90, "sglang", {}).method == "fp8"


def test_weight_bytes_follow_the_format_and_the_kv_dtype_does_not() -> None:
    base = quantization.load_checkpoint("meta-llama/Llama-3.1-8B-Instruct")
    sizes = {}
    for name in (
        "meta-llama/Llama-3.1-8B-Instruct",
        "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    ):
        m = quantization.apply(quantization.load_checkpoint(name), None, H200, "vllm", {})
        sizes[name.split("-")[-1]] = m.weight_bytes_per_gpu(1)
        assert m.dtype_bytes == base.dtype_bytes  # KV "auto" stays the activation dtype
    bf16, fp8, int4 = sizes["Instruct"], sizes["FP8"], sizes["INT4"]
    assert 0.5 < fp8 / bf16 < 0.65  # embeddings stay 16-bit
    assert 0.25 < int4 / bf16 < 0.4
    m = quantization.apply(
        quantization.load_checkpoint("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8"), "fp8", H200, "vllm", {}
    )
    assert m.active_params == pytest.approx(base.active_params * 0.5)  # FP8 tensor cores: 2x BF16 rate


# ------------------------------------------------------------------ evidence from real engine logs


def test_vllm_awq_marlin_selection_and_weight_memory_from_a_real_016_log() -> None:
    ev = qev.kernel_evidence(sample(FIX, "vLLM 0.16.0"))
    assert (ev.method, ev.kernel, ev.fallback) == ("awq_marlin", "awq_marlin", None)
    assert ev.weight_gib == 18.55
    assert qev.served_format("awq_marlin", "awq_int4", ev)["status"] == "as requested"


def test_forced_plain_awq_is_recorded_as_the_slow_path() -> None:
    ev = qev.kernel_evidence(sample(FIX, "issues/20112"))
    assert ev.method == "awq" and ev.kernel == "awq" and "forced instead of awq_marlin" in ev.slow_path
    assert qev.served_format("awq", "awq_int4", ev)["status"] == "as requested (slow kernel)"


@pytest.mark.parametrize("source", ["club-3090", "issues/12887"])
def test_a_real_fp8_marlin_fallback_is_never_passed_as_fp8(source) -> None:
    ev = qev.kernel_evidence(sample(FIX, source))
    assert ev.fallback and "weight-only" in ev.fallback.lower()
    served = qev.served_format("fp8", "fp8", ev)
    assert served["status"] == "fallback"


def test_a_kernel_the_engine_could_not_find_is_a_refusal() -> None:
    ev = qev.kernel_evidence(sample(FIX, "llm-compressor/issues/973"))
    assert ev.kernel == "MarlinLinearKernel" and ev.errors
    assert qev.served_format("gptq_marlin", "gptq_int4", ev)["status"] == "refused"


def test_newest_sglang_load_line_names_the_method_and_the_weight_memory() -> None:
    ev = qev.kernel_evidence(sample(FIX, "65830671609"))
    assert ev.method == "fp8" and ev.fp8_checkpoint and ev.weight_gib == 28.49 and ev.fallback is None


def test_enginesims_lines_read_back_as_the_kernel_it_chose() -> None:
    """The emulator's start-up lines go through the same parser as the real ones."""
    for flavour in ("vllm", "sglang"):
        sel = quantization.select(
            "fp8", FP8, 90, flavour, {"SGLANG_FORCE_FP8_MARLIN": "1", "VLLM_TEST_FORCE_FP8_MARLIN": "1"}
        )
        ev = qev.kernel_evidence("\n".join(ln.text for ln in sel.lines))
        assert ev.fallback and qev.served_format("fp8", "fp8", ev)["status"] == "fallback"
        sel = quantization.select("gptq_marlin", GPTQ, 90, flavour, {})
        ev = qev.kernel_evidence("\n".join(ln.text for ln in sel.lines))
        assert qev.served_format("gptq_marlin", "gptq_int4", ev)["status"] == "as requested"


def test_an_unquantized_variant_that_logs_no_method_is_as_requested_and_a_silent_one_is_unproven() -> None:
    assert qev.served_format(None, "bf16", qev.kernel_evidence(""))["status"] == "as requested"
    assert qev.served_format("awq_marlin", "awq_int4", qev.kernel_evidence(""))["status"] == "unproven"


def test_lm_eval_results_and_nvidia_smi_memory() -> None:
    doc = {
        "results": {
            "wikitext": {
                "alias": "wikitext",
                "word_perplexity,none": 9.87,
                "word_perplexity_stderr,none": "N/A",
            },
            "arc_easy": {"acc,none": 0.81, "acc_stderr,none": 0.008, "acc_norm,none": 0.79},
        }
    }
    scores = qev.lm_eval_scores(doc)
    assert scores["wikitext"] == {"metric": "word_perplexity", "value": 9.87, "stderr": None}
    assert scores["arc_easy"]["metric"] == "acc_norm" and scores["arc_easy"]["value"] == 0.79
    rows = qev.gpu_memory("0, NVIDIA H200, 80123, 143771\n1, NVIDIA H200, 4, 143771\nbad line\n")
    assert [r["used_mib"] for r in rows] == [80123.0, 4.0]


# ------------------------------------------------------------------ plan and verdict


def _cfg(engine: str = "sglang") -> dict:
    cfg = config("quant_matrix", engine)
    for v in cfg["definition"]["variants"]:
        v["model"] = DEFAULTS["labs_quant_models"][v["name"]]
    cfg["workload"]["eval_tasks"] = list(DEFAULTS["labs_quant_eval_tasks"])
    return cfg


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_plan_every_format_with_its_checkpoint_and_the_same_four_runs(engine) -> None:
    p = lab_plan.build(_cfg(engine))
    assert [v["name"] for v in p["variants"]] == ["bf16", "fp8", "awq_int4", "gptq_int4"]
    assert p["variants"][2]["model"].endswith("AWQ-INT4")
    runs = [[r["name"] for r in v["runs"]] for v in p["variants"]]
    assert all(r == ["random_c1", "random_sat", "sharegpt_c1", "sharegpt_sat"] for r in runs)
    assert {r["workload"]["concurrency"] for r in p["variants"][0]["runs"]} == {1, 32}
    for c in p["comparisons"]:
        assert set(c["differs"]) == {"--quantization", "model"}
    assert "sharegpt_shaped" in p["datasets"]


def test_plan_refuses_a_model_that_is_not_a_plain_name_and_an_undeclared_checkpoint_change() -> None:
    cfg = _cfg()
    cfg["definition"]["variants"][1]["model"] = "x; rm -rf /"
    with pytest.raises(InputError, match=r"variants\[1\]\.model"):
        lab_plan.build(cfg)
    cfg = _cfg()
    cfg["definition"]["comparisons"][0]["flags"] = ["--quantization"]
    with pytest.raises(InputError, match="one independent variable"):
        lab_plan.build(cfg)
    cfg = _cfg()
    cfg["workload"]["eval_tasks"] = ["arc_easy;id"]
    with pytest.raises(InputError, match="eval_tasks"):
        lab_plan.build(cfg)


def _fig(status: str, fallback: str | None, tpot: float, comparable: bool = True) -> dict:
    return {
        "served": {"status": status, "why": fallback or ""},
        "kernel": {"kernel": "k", "fallback": fallback, "slow_path": None, "errors": []},
        "memory": {"weights_gib_from_log": 1.0, "kv_capacity_tokens": 10, "nvidia_smi": "not measured"},
        "comparable": comparable,
        "not_comparable_why": "" if comparable else f"{status}: {fallback}",
        "requested_quantization": "fp8",
        "runs": {
            "random_c1": {"tpot_p99_ms": tpot},
            "random_sat": {"output_tok_s": 100.0, "concurrency": 32},
        },
        "accuracy": {"status": quant.EMULATED_ACCURACY},
    }


COMPS = [{"baseline": "bf16", "treatment": "fp8", "variable": "FP8 weights", "expect": "lower"}]
WL = copy.deepcopy(DEFAULTS["labs_workloads"]["quant_matrix"])


def test_verdict_supported_only_when_the_format_was_served_and_faster() -> None:
    fig = {"variants": {"bf16": _fig("as requested", None, 10.0), "fp8": _fig("as requested", None, 6.0)}}
    assert quant.judge(fig, COMPS, WL, {}).verdict == SUPPORTED
    fig["variants"]["fp8"] = _fig("as requested", None, 9.9)
    assert quant.judge(fig, COMPS, WL, {}).verdict == NOT_SUPPORTED


def test_a_fallback_is_not_comparable_even_when_it_looks_faster() -> None:
    fb = "FP8 weight-only Marlin (W8A16)"
    fig = {
        "variants": {
            "bf16": _fig("as requested", None, 10.0),
            "fp8": _fig("fallback", fb, 5.0, comparable=False),
        }
    }
    v = quant.judge(fig, COMPS, WL, {})
    assert v.verdict == INCONCLUSIVE and "not comparable" in v.reason and "fallback" in v.reason
    assert v.comparisons[0]["verdict"] == INCONCLUSIVE
    pits = quant.pitfalls(
        {"variants": {"fp8": fig["variants"]["fp8"] | {"kernel": {**fig["variants"]["fp8"]["kernel"]}}}}, WL
    )
    assert any("FALLBACK" in p for p in pits)


def test_gpu_names_map_to_their_compute_capability() -> None:
    assert quant.capability("NVIDIA A100-SXM4-80GB") == 80 and quant.capability("NVIDIA H200") == 90
    assert quant.capability("NVIDIA L40S") == 89 and quant.capability("h200") == 90
