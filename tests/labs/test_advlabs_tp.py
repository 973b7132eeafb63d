"""tp_scaling without a server: the efficiency formula, the knee, the plan, the profiler trace written by
enginesim and read by analysis (the same path a real torch trace takes), and the verdict."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from labs_helpers import DEFAULTS, REPO, config, rendered

sys.path.insert(0, str(REPO))
from analysis.errors import InputError
from analysis.evidence import trace
from analysis.labs import plan as lab_plan
from analysis.labs import tp
from analysis.labs.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED
from enginesim import catalog, profiling
from enginesim.costmodel import CostModel


def test_efficiency_is_throughput_over_n_times_tp1() -> None:
    assert tp.efficiency(700.0, 4, 200.0) == pytest.approx(0.875)
    assert tp.efficiency(400.0, 2, 200.0) == pytest.approx(1.0)
    assert tp.efficiency(200.0, 1, 200.0) == pytest.approx(1.0)
    assert tp.efficiency(None, 2, 200.0) is None and tp.efficiency(100.0, 2, 0.0) is None


def test_knee_is_the_first_rate_whose_ttft_shows_queueing() -> None:
    rows = [
        {"rate": 50, "ttft_p50_ms": 90.0},
        {"rate": 5, "ttft_p50_ms": 40.0},
        {"rate": 20, "ttft_p50_ms": 70.0},
        {"rate": 100, "ttft_p50_ms": 400.0},
    ]
    assert tp.knee(rows) == 50
    assert tp.knee(rows[1:3]) is None
    assert tp.knee([{"rate": 5, "ttft_p50_ms": None}, {"rate": 50, "ttft_p50_ms": 900.0}]) is None


def _cfg(engine: str) -> dict:
    cfg = config("tp_scaling", engine)
    cfg["definition"] = {
        "variants": [
            {
                "name": f"tp{n}",
                "model": DEFAULTS["labs_tp_model"],
                "args": [],
                "engine": {"engine_tp_size": n},
            }
            for n in DEFAULTS["labs_tp_sizes"]
        ]
    }
    return cfg


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_plan_one_sweep_per_tp_size_with_the_top_rate_profiled(engine) -> None:
    p = lab_plan.build(_cfg(engine))
    assert [v["engine_vars"]["engine_tp_size"] for v in p["variants"]] == [1, 2, 4, 8]
    runs = p["variants"][0]["runs"]
    assert [r["name"] for r in runs] == ["r5", "r10", "r20", "r50", "r100"]
    assert [r["profile"] for r in runs] == [False, False, False, False, True]
    assert runs[2]["argv"][runs[2]["argv"].index("--request-rate") + 1] == "20"


def test_plan_offers_the_rates_in_wall_seconds_divided_by_the_labs_time_scale() -> None:
    """At time scale 4 the emulator takes 4 wall seconds per emulated second: a 20 req/s point of the
    emulated hardware is sent at 5 req/s, and the run keeps its emulated rate for the figures."""
    cfg = _cfg("sglang") | {"time_scale": "4"}
    runs = lab_plan.build(cfg)["variants"][0]["runs"]
    assert runs[2]["name"] == "r20" and runs[2]["workload"]["request_rate"] == 20
    assert runs[2]["argv"][runs[2]["argv"].index("--request-rate") + 1] == "5"
    assert runs[2]["workload"]["wall_request_rate"] == 5
    for bad in ("auto", "0", -1):
        with pytest.raises(InputError, match=r"ENGINESIM_TIME_SCALE.*expected a fixed time scale"):
            lab_plan.build(_cfg("sglang") | {"time_scale": bad})


def test_plan_refuses_a_bad_rate_list() -> None:
    cfg = _cfg("sglang")
    cfg["workload"]["rates"] = [5, 0]
    with pytest.raises(InputError, match="rates"):
        lab_plan.build(cfg)
    cfg["workload"]["rates"] = [5, 5]
    with pytest.raises(InputError, match="twice"):
        lab_plan.build(cfg)


def test_trace_summary_merges_overlapping_kernels_and_counts_gaps_as_idle() -> None:
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 0, "dur": 10},
            {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 5, "dur": 10},  # overlaps
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                "ts": 20,
                "dur": 5,
            },
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},  # not a kernel
            {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "ts": 30, "dur": 10},
        ]
    }
    s = trace.summarize(doc)
    assert (s.gemm_us, s.attention_us, s.nccl_us, s.other_us) == (10, 10, 5, 10)
    assert s.window_us == 40 and s.idle_us == 10  # gaps 15-20 and 25-30
    assert s.shares()["nccl"] == pytest.approx(0.125)


def _emulated_trace(tp_size: int) -> dict:
    model = catalog.load_model("meta-llama/Llama-3.1-8B-Instruct")
    hw = catalog.load_hardware("h200")
    cost = CostModel(model, hw, tp_size, 1, 1, model.kv_bytes_per_token(2, tp_size), True, 64, False)
    rec = profiling.Recorder(cost, 1.0)
    rec.active = True
    for _ in range(20):
        rec.step([], 32, 32, 32 * 1000)  # a decode step of 32 requests with 1k context each
    rec.step([(512, 0)], 0, 0, 0)  # a prefill chunk
    return profiling.chrome_trace(rec.steps, tp_size, "sglang")


def test_enginesims_trace_reads_back_with_nccl_only_under_tp(tmp_path) -> None:
    shares = {}
    for n in (1, 2, 8):
        path = tmp_path / f"t{n}-TP-0.trace.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(_emulated_trace(n), f)
        s = trace.summarize(trace.load(path))
        assert s.emulated and s.kernels > 0 and s.gemm_us > 0 and s.attention_us > 0
        # steps priced back to back in wall time still sit end to end: the shares add up to the window
        assert sum(v for v in s.shares().values() if v) == pytest.approx(1.0, abs=1e-3)
        shares[n] = s.shares()["nccl"]
    assert shares[1] == 0 and 0 < shares[2] < shares[8]


def test_an_unreadable_trace_is_an_input_error(tmp_path) -> None:
    bad = tmp_path / "x.trace.json.gz"
    bad.write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(InputError):
        trace.load(bad)


def _v(tp_size: int, thr: float, nccl: float | None) -> dict:
    summary = None if nccl is None else {"shares": {"nccl": nccl}, "emulated": True}
    return {
        "tp": tp_size,
        "knee_req_s": None,
        "rates": [{"rate": 100, "output_tok_s": thr, "output_tok_s_per_gpu": thr / tp_size}],
        "trace": {"status": "read", "summary": summary} if summary else {"status": "no trace file"},
        "topology": "not measured",
    }


def _fig(*vs: dict) -> dict:
    variants = {f"tp{v['tp']}": v for v in vs}
    base = vs[0]["rates"][0]["output_tok_s"]
    eff = {
        k: {"100": tp.efficiency(v["rates"][0]["output_tok_s"], v["tp"], base)} for k, v in variants.items()
    }
    return {"variants": variants, "efficiency": eff}


WL = DEFAULTS["labs_workloads"]["tp_scaling"]


def test_verdict_needs_rising_throughput_and_rising_communication() -> None:
    assert (
        tp.judge(_fig(_v(1, 100, 0.0), _v(2, 180, 0.05), _v(4, 300, 0.12)), [], WL, {}).verdict == SUPPORTED
    )
    v = tp.judge(_fig(_v(1, 100, 0.0), _v(2, 90, 0.05)), [], WL, {})
    assert v.verdict == NOT_SUPPORTED and "throughput rises with TP: no" in v.reason
    assert tp.judge(_fig(_v(1, 100, 0.0), _v(2, 180, None)), [], WL, {}).verdict == INCONCLUSIVE
    assert tp.judge(_fig(_v(2, 100, 0.1), _v(4, 180, 0.2)), [], WL, {}).verdict == INCONCLUSIVE


@pytest.mark.parametrize(("engine", "flag"), [("sglang", "--dp-size"), ("vllm", "--data-parallel-size")])
def test_plan_adds_one_dp_point_against_tp_n_with_its_one_variable(engine, flag) -> None:
    """The role's defaults: DP=8 (the largest TP size listed) as n replicas at TP=1, with the engine's
    own DP flag; the comparison with TP=8 declares the split of the GPUs as its one variable."""
    p = lab_plan.build(config("tp_scaling", engine))
    dp = p["variants"][-1]
    assert dp["name"] == "dp8"
    assert dp["args"] == [flag, "8"] and dp["engine_vars"] == {"engine_tp_size": 1}
    assert [r["name"] for r in dp["runs"]] == [r["name"] for r in p["variants"][0]["runs"]]
    (c,) = p["comparisons"]
    assert (c["baseline"], c["treatment"]) == ("tp8", "dp8")
    assert c["differs"] == {
        flag: {"baseline": None, "treatment": ["8"]},
        "engine_tp_size": {"baseline": ["8"], "treatment": ["1"]},
    }
    assert "TP=8 vs DP=8" in c["variable"]
    none = config("tp_scaling", engine, definition=rendered(
        DEFAULTS["labs_definitions"]["tp_scaling"][engine], {**DEFAULTS, "labs_tp_dp_size": 0}
    ))  # fmt: skip
    p0 = lab_plan.build(none)
    assert [v["name"] for v in p0["variants"]] == ["tp1", "tp2", "tp4", "tp8"] and p0["comparisons"] == []


def test_plan_refuses_an_engine_setting_outside_the_declared_variable() -> None:
    cfg = config("tp_scaling", "sglang")
    cfg["definition"]["comparisons"][0]["flags"] = ["--dp-size"]
    with pytest.raises(InputError, match="differ in engine settings"):
        lab_plan.build(cfg)


def _row(rate: float, thr: float, ttft: float, tpot: float) -> dict:
    return {"rate": rate, "output_tok_s": thr, "ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft,
            "tpot_p50_ms": tpot, "tpot_p99_ms": 2 * tpot}  # fmt: skip


def test_dp_over_tp_ratio_is_computed_per_rate_from_the_rows() -> None:
    variants = {
        "tp1": {"tp": 1, "dp": 1, "rates": [_row(10, 100.0, 50.0, 10.0), _row(100, 400.0, 900.0, 20.0)]},
        "tp4": {"tp": 4, "dp": 1, "rates": [_row(10, 100.0, 20.0, 4.0), _row(100, 1000.0, 60.0, 6.0)]},
        "dp4": {"tp": 1, "dp": 4, "rates": [_row(10, 100.0, 50.0, 10.0), _row(100, 1500.0, 80.0, 12.0)]},
    }
    c = tp.dp_comparison(variants)
    assert list(c) == ["dp4"] and c["dp4"]["against"] == "tp4"
    r10, r100 = c["dp4"]["rates"]
    assert r10["dp_over_tp_output_tok_s"] == pytest.approx(1.0)
    assert r100["dp_over_tp_output_tok_s"] == pytest.approx(1.5)
    assert (r100["dp_tpot_p50_ms"], r100["tp_tpot_p50_ms"]) == (12.0, 6.0)
    assert tp.dp_ratio(None, 3.0) is None and tp.dp_ratio(3.0, 0.0) is None
    # the report line says who wins where, from these rows only
    fig = {"variants": variants, "dp_vs_tp": c}
    (line,) = tp._dp_observations(fig, WL)
    assert "ratio DP/TP 1.0 at 10, 1.5 at 100 req/s" in line
    assert "higher output throughput: DP at 100 req/s" in line
    assert "lower TPOT p50: TP at 10, 100 req/s" in line
    assert "lower TTFT p99: TP at 10, 100 req/s" in line
    # a DP point without its TP=n says so, and it never counts as a TP size in the verdict
    lone = tp.dp_comparison({"tp1": variants["tp1"], "dp4": variants["dp4"]})
    assert lone["dp4"]["status"] == "no TP=4 variant to compare with"


def test_a_dp_point_is_not_a_tp_size_in_the_verdict() -> None:
    """dp2 runs at TP=1: read as a TP size it would make a second TP=1 (throughput not rising)."""
    fig = _fig(_v(1, 100, 0.0), _v(2, 180, 0.05))
    fig["variants"]["dp2"] = dict(_v(1, 200, 0.0), dp=2)
    fig["dp_vs_tp"] = tp.dp_comparison(fig["variants"])
    v = tp.judge(fig, [], WL, {})
    assert v.verdict == SUPPORTED, v.reason
    assert any(o.startswith("DP=2 replicas at TP=1 vs TP=2") for o in v.observations)
