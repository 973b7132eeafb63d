"""analysis/labs/verdicts.py: each lab's verdict is a pure function of its figures.

Figures here are shaped exactly as analysis/labs/figures.py writes them; the cases that must not
come out supported (a KV that never filled, a flush not proven, a failed run, a saturated emulator,
a missing figure) are each forced.
"""

from __future__ import annotations

import copy
from pathlib import Path

from analysis.labs import verdicts as V
from analysis.labs.judge import prefix_chat_pitfalls, sweep_flip_pitfalls

REPO = Path(__file__).resolve().parents[2]
TH = V.thresholds(None)
CMP_EAGER = [
    {"baseline": "graph", "treatment": "eager", "variable": "CUDA graphs", "expect": "higher", "differs": {}}
]


def _sweep(graph_c1: float | None, eager_c1: float | None) -> dict:
    def rows(c1: float | None) -> dict:
        return {
            f"c{c}": {"concurrency": c, "tpot_p50_ms": c1 if c == 1 else 1.0, "tpot_p99_ms": 2.0}
            for c in (1, 4, 16)
        }

    return {"variants": {"graph": rows(graph_c1), "eager": rows(eager_c1)}}


def test_graph_faster_than_eager_at_c1_is_supported_and_equal_is_not() -> None:
    v = V.judge("eager_vs_graph", _sweep(0.41, 1.41), CMP_EAGER, {"isl": 256, "osl": 32})
    assert v.verdict == V.SUPPORTED and "C=1" in v.reason and "3.44x" in v.reason
    v = V.judge("eager_vs_graph", _sweep(0.41, 0.43), CMP_EAGER, {})
    assert v.verdict == V.NOT_SUPPORTED and "within ±10%" in v.reason
    v = V.judge("eager_vs_graph", _sweep(0.41, None), CMP_EAGER, {})
    assert v.verdict == V.INCONCLUSIVE and "missing" in v.reason


def test_precheck_failed_run_failed_variant_or_saturated_emulator_is_inconclusive() -> None:
    assert V.precheck({"a": {"failed": None, "runs_failed": [], "realtime": "ok"}}) is None
    assert V.precheck({"a": {"failed": None, "runs_failed": [], "realtime": "degraded"}}) is None
    for st in ({"failed": "port busy"}, {"runs_failed": ["c1 failed: TIMEOUT"]}, {"realtime": "saturated"}):
        got = V.precheck({"a": {"failed": None, "runs_failed": [], "realtime": "ok"} | st})
        assert got is not None and got.verdict == V.INCONCLUSIVE
    # a late emulator still counts preemptions and announces capacity right: not a reason there
    saturated = {"a": {"failed": None, "runs_failed": [], "realtime": "saturated"}}
    assert V.precheck(saturated, timed=False) is None
    assert "kv_pressure" not in V.TIMED_LABS and "fp8_kv" not in V.TIMED_LABS


def _kv(preempted: float | None, usage: float | None, retraction_lines: list[str] | None = None) -> dict:
    proofs = []
    if usage is not None and usage >= 0.9:
        proofs.append(f"fill: sampled KV usage reached {usage:.2f}")
    if retraction_lines:
        proofs.append(f"server log: {retraction_lines[0]!r}")
    run = {
        "status": "completed",
        "n": 8,
        "expected": 8,
        "preemptions": preempted,
        "max_kv_usage": usage,
        "max_running": 8,
        "max_waiting": 0,
        "server_queue_time_mean_ms": 1.0,
    }
    return {
        "variants": {
            "kv4096": {"capacity": {"tokens": 4096}, "runs": {"fill": run}, "kv_full_proofs": proofs}
        },
        "full_threshold": 0.9,
    }


def test_kv_pressure_needs_proof_of_a_full_kv_either_way() -> None:
    assert V.judge("kv_pressure", _kv(3.0, 0.97), [], {}).verdict == V.SUPPORTED
    # the KV never filled and nothing was preempted: never "supported", never "not supported"
    never_full = V.judge("kv_pressure", _kv(0.0, 0.4), [], {})
    assert never_full.verdict == V.INCONCLUSIVE and "nothing proves the KV was ever full" in never_full.reason
    # full and no preemption: the mechanism did not act
    assert V.judge("kv_pressure", _kv(0.0, 0.99), [], {}).verdict == V.NOT_SUPPORTED
    # counters moved but no sample / line shows the KV full (SGLang gauges only move at log points)
    assert V.judge("kv_pressure", _kv(2.0, 0.5), [], {}).verdict == V.INCONCLUSIVE
    assert (
        V.judge(
            "kv_pressure",
            _kv(2.0, 0.5, ["KV cache pool is full. Retract requests. #retracted_reqs: 1"]),
            [],
            {},
        ).verdict
        == V.SUPPORTED
    )
    assert V.judge("kv_pressure", _kv(None, 0.99), [], {}).verdict == V.INCONCLUSIVE


CMP_PREFIX = [
    {
        "baseline": "cache_on",
        "treatment": "cache_off",
        "variable": "prefix caching",
        "expect": "lower",
        "differs": {},
    }
]


def _prefix(
    on_second: int | None, on_ttft: tuple[float, float], flush_ok: bool = True, first_cached: int = 0
) -> dict:
    def var(second: int | None, ttft: tuple[float, float]) -> dict:
        return {
            "identical_first": {
                "ttft_ms": ttft[0],
                "cached_tokens": first_cached,
                "hit_delta": 0.0,
                "flush": {"endpoint_ok": flush_ok},
            },
            "identical_second": {"ttft_ms": ttft[1], "cached_tokens": second},
            "chat": {"n": 9},
        }

    return {
        "variants": {"cache_on": var(on_second, on_ttft), "cache_off": var(0, (10.0, 10.0))},
        "counters": {"hits": "sglang:cached_tokens_total", "queries": "sglang:prompt_tokens_total"},
    }


def test_prefix_cache_second_request_cached_and_faster_is_supported() -> None:
    v = V.judge("prefix_cache", _prefix(2079, (15.0, 4.0)), CMP_PREFIX, {"identical_len": 2080})
    assert v.verdict == V.SUPPORTED, v.reason
    assert V.judge("prefix_cache", _prefix(1024, (15.0, 4.0)), CMP_PREFIX, {}).verdict == V.NOT_SUPPORTED
    assert V.judge("prefix_cache", _prefix(2079, (15.0, 14.5)), CMP_PREFIX, {}).verdict == V.NOT_SUPPORTED


def test_prefix_cache_without_a_proven_flush_is_inconclusive() -> None:
    v = V.judge("prefix_cache", _prefix(2079, (15.0, 4.0), flush_ok=False), CMP_PREFIX, {})
    assert v.verdict == V.INCONCLUSIVE and "flush" in v.reason
    v = V.judge("prefix_cache", _prefix(2079, (15.0, 4.0), first_cached=2000), CMP_PREFIX, {})
    assert v.verdict == V.INCONCLUSIVE and "did not empty the cache" in v.reason


def _chunk(big: float, small: float, before: float = 0.43, valid: int = 5) -> dict:
    def var(mx: float) -> dict:
        return {
            "reps": {},
            "valid_reps": valid,
            "median_gap_before_ms": before,
            "max_gap_during_ms_median": mx,
            "injection_e2e_ms_median": 25.0,
            "stall_ratio": mx / before,
        }

    return {"variants": {"chunk8192": var(big), "chunk512": var(small)}}


CMP_CHUNK = [
    {"baseline": "chunk8192", "treatment": "chunk512", "variable": "chunk", "expect": "lower", "differs": {}}
]


def test_chunk_interference_stall_and_its_bound() -> None:
    assert V.judge("chunk_interference", _chunk(24.7, 2.4), CMP_CHUNK, {}).verdict == V.SUPPORTED
    assert V.judge("chunk_interference", _chunk(24.7, 25.8), CMP_CHUNK, {}).verdict == V.NOT_SUPPORTED
    no_stall = V.judge("chunk_interference", _chunk(0.9, 0.5), CMP_CHUNK, {})
    assert no_stall.verdict == V.NOT_SUPPORTED and "only 2.1x" in no_stall.reason
    assert V.judge("chunk_interference", _chunk(24.7, 2.4, valid=1), CMP_CHUNK, {}).verdict == V.INCONCLUSIVE


def _fp8(auto: int | None, fp8: int | None, capped: bool = False) -> dict:
    def var(t: int | None, flag: str) -> dict:
        return {
            "capacity": {"tokens": t, "line": "x"} if t else None,
            "kv_dtype_flag": flag,
            "capacity_capped_by_flag": capped,
            "fp8_platform_notes": [],
        }

    return {"variants": {"kv_auto": var(auto, "auto"), "kv_fp8": var(fp8, "fp8")}}


CMP_FP8 = [
    {"baseline": "kv_auto", "treatment": "kv_fp8", "variable": "KV dtype", "expect": "higher", "differs": {}}
]


def test_fp8_capacity_ratio_is_measured_and_judged() -> None:
    v = V.judge("fp8_kv", _fp8(1096086, 2192173), CMP_FP8, {})
    assert v.verdict == V.SUPPORTED and any("2.000" in o for o in v.observations)
    assert (
        V.judge("fp8_kv", _fp8(100, 120), CMP_FP8, {}).verdict == V.NOT_SUPPORTED
    )  # 1.2x: below fp8_min_ratio
    assert V.judge("fp8_kv", _fp8(100, None), CMP_FP8, {}).verdict == V.INCONCLUSIVE
    assert V.judge("fp8_kv", _fp8(4096, 4096, capped=True), CMP_FP8, {}).verdict == V.INCONCLUSIVE


def _ngram(rep: float | None, prose: float | None, e2e_base: float = 100.0, e2e_spec: float = 40.0) -> dict:
    def kinds(acc_rep: float | None, acc_prose: float | None, e2e: float) -> dict:
        def one(a: float | None) -> dict:
            return {
                "samples": 3,
                "ok": 3,
                "flushes_proven": 3,
                "e2e_p50_ms": e2e,
                "tpot_p50_ms": 1.0,
                "acceptance": {"accept_length": a, "accept_rate": 0.5} if a is not None else None,
            }

        return {"prompts": {"repetitive": one(acc_rep), "prose": one(acc_prose)}}

    return {"variants": {"baseline": kinds(None, None, e2e_base), "ngram": kinds(rep, prose, e2e_spec)}}


CMP_NGRAM = [
    {"baseline": "baseline", "treatment": "ngram", "variable": "ngram", "expect": "lower", "differs": {}}
]


def test_ngram_accept_length_on_repetitive_text_above_prose() -> None:
    v = V.judge("ngram_spec", _ngram(3.85, 1.2), CMP_NGRAM, {"osl": 256})
    assert v.verdict == V.SUPPORTED and "bonus token included" in v.reason
    assert V.judge("ngram_spec", _ngram(1.4, 1.2), CMP_NGRAM, {}).verdict == V.NOT_SUPPORTED  # <= 1.5
    assert (
        V.judge("ngram_spec", _ngram(2.0, 2.5), CMP_NGRAM, {}).verdict == V.NOT_SUPPORTED
    )  # not above prose
    assert V.judge("ngram_spec", _ngram(None, None), CMP_NGRAM, {}).verdict == V.INCONCLUSIVE
    slower = V.judge("ngram_spec", _ngram(3.85, 1.2, e2e_spec=120.0), CMP_NGRAM, {})
    assert slower.verdict == V.NOT_SUPPORTED and "E2E p50" in slower.reason
    unflushed = _ngram(3.85, 1.2)
    unflushed["variants"]["ngram"]["prompts"]["prose"]["flushes_proven"] = 2
    assert V.judge("ngram_spec", unflushed, CMP_NGRAM, {}).verdict == V.INCONCLUSIVE


def test_sweeps_need_rising_figures() -> None:
    rows = {
        f"c{c}": {"concurrency": c, "tpot_p50_ms": t, "itl_p99_ms": 1.0, "output_tok_s": tps}
        for c, t, tps in ((1, 0.4, 2000.0), (4, 0.45, 5400.0), (16, 0.5, 11800.0))
    }
    assert V.judge("decode_sweep", {"variants": {"server": rows}}, [], {}).verdict == V.SUPPORTED
    flat = copy.deepcopy(rows)
    flat["c16"]["output_tok_s"] = 5500.0
    assert V.judge("decode_sweep", {"variants": {"server": flat}}, [], {}).verdict == V.NOT_SUPPORTED
    pre = {
        f"isl{i}": {"isl": i, "ttft_p50_ms": t, "prefill_tok_s_p50": 1.0, "max_cached_tokens": 0}
        for i, t in ((256, 1.7), (1024, 3.5), (4096, 15.1))
    }
    assert V.judge("prefill_sweep", {"variants": {"server": pre}}, [], {}).verdict == V.SUPPORTED
    pre["isl1024"]["max_cached_tokens"] = 900
    assert V.judge("prefill_sweep", {"variants": {"server": pre}}, [], {}).verdict == V.INCONCLUSIVE


def test_token_budget_judges_the_short_requests_ttft() -> None:
    def var(ttft: float, gap: float) -> dict:
        return {
            "short_tpot_p99_ms": 0.7,
            "short_max_gap_ms_median": gap,
            "short_ttft_p99_ms": ttft,
            "long_e2e_ms_median": 33.0,
            "reps": 3,
        }

    cmp = [
        {
            "baseline": "budget16384",
            "treatment": "budget1024",
            "variable": "b",
            "expect": "lower",
            "differs": {},
        }
    ]
    # vLLM on enginesim: the big budget took the long prefill in the shorts' first step (TTFT 34 ms,
    # gaps 1.4 ms); the small one cut it beside their decode (TTFT 6 ms, gaps 5 ms)
    fig = {"variants": {"budget16384": var(34.0, 1.45), "budget1024": var(6.3, 5.0)}}
    v = V.judge("token_budget", fig, cmp, {})
    assert v.verdict == V.SUPPORTED and "TTFT p99" in v.reason
    assert any("largest gap 5.00 ms" in o for o in v.observations)
    fig["variants"]["budget1024"]["short_ttft_p99_ms"] = 33.0
    assert V.judge("token_budget", fig, cmp, {}).verdict == V.NOT_SUPPORTED


def test_direction_margin() -> None:
    assert V.direction(1.0, 1.2, 0.1) == "higher"
    assert V.direction(1.0, 0.95, 0.1) == "same"
    assert V.direction(1.0, 0.8, 0.1) == "lower"
    assert V.direction(0.0, 0.0, 0.1) == "same"
    assert V.direction(None, 1.0, 0.1) is None


def test_chat_ttft_that_contradicts_the_cached_tokens_is_flagged_with_the_runs_own_noise() -> None:
    def row(first: float, chat_p50: float, cached: float) -> dict:
        return {
            "identical_first": {"ttft_ms": first},
            "chat": {"ttft_p50_ms": chat_p50, "cached_tokens_median": cached},
        }

    contradicting = {"variants": {"cache_on": row(9.97, 3.05, 768), "cache_off": row(6.07, 2.09, 0)}}
    (note,) = prefix_chat_pitfalls(contradicting)
    assert note.startswith("cache_on: the chat TTFT p50 (3.05 ms, 768 cached")
    assert "cache_off's (2.09 ms" in note and "9.97 vs 6.07 ms" in note
    consistent = {"variants": {"cache_on": row(6.0, 1.2, 768), "cache_off": row(6.1, 2.1, 0)}}
    assert prefix_chat_pitfalls(consistent) == []


def test_a_concurrency_the_graph_verdict_does_not_read_is_flagged_when_it_goes_the_other_way() -> None:
    def rows(*tpots: float) -> dict:
        return {f"c{c}": {"concurrency": c, "tpot_p50_ms": t} for c, t in zip((1, 4, 16), tpots, strict=True)}

    comps = [{"baseline": "graph", "treatment": "eager", "expect": "higher"}]
    flipped = {"variants": {"graph": rows(0.46, 0.42, 1.49), "eager": rows(1.36, 1.43, 0.89)}}
    (note,) = sweep_flip_pitfalls(flipped, comps, 0.1)
    assert note.startswith("at C=16 the TPOT p50 of eager (0.89 ms) is lower than graph's (1.49 ms)")
    even = {"variants": {"graph": rows(0.46, 0.42, 1.0), "eager": rows(1.36, 1.43, 1.05)}}
    assert "within ±10% of" in sweep_flip_pitfalls(even, comps, 0.1)[0]
    consistent = {"variants": {"graph": rows(0.46, 0.42, 0.8), "eager": rows(1.36, 1.43, 1.6)}}
    assert sweep_flip_pitfalls(consistent, comps, 0.1) == []


def test_an_unknown_emulator_verdict_makes_a_timed_lab_inconclusive_never_supported() -> None:
    unknown = {"a": {"failed": None, "runs_failed": [], "realtime": "unknown", "realtime_reason": "no step"}}
    got = V.precheck(unknown, timed=True)
    assert got is not None and got.verdict == V.INCONCLUSIVE and "unknown (no step)" in got.reason
    assert V.precheck(unknown, timed=False) is None  # counters and capacity lines do not rest on time


CMP_CHUNK3 = [
    {"baseline": "chunk8192", "treatment": "chunk512", "variable": "prefill chunk size", "expect": "lower"},
    {"baseline": "chunk512", "treatment": "chunk512_mixed", "variable": "mixed chunk", "expect": "lower"},
]


def test_chunk_conclusion_says_what_both_comparisons_showed_from_the_figures() -> None:
    fig = _chunk(25.75, 57.86)
    fig["variants"]["chunk512_mixed"] = dict(fig["variants"]["chunk512"], max_gap_during_ms_median=4.58)
    said = V.chunk_conclusion(fig, CMP_CHUNK3, "sglang", 0.1)
    assert "made the stall longer 25.75→57.86 ms (2.25x)" in said
    assert "cut it 12.6x (57.86→4.58 ms)" in said
    assert "runs a long prompt's chunks back to back" in said
    # when smaller chunks alone did shorten it, the explanation is not claimed
    fig = _chunk(25.75, 2.4)
    fig["variants"]["chunk512_mixed"] = dict(fig["variants"]["chunk512"], max_gap_during_ms_median=2.3)
    said = V.chunk_conclusion(fig, CMP_CHUNK3, "sglang", 0.1)
    assert "cut the stall 10.7x (25.75→2.40 ms)" in said and "left it within ±10%" in said
    assert "back to back" not in said
    assert V.chunk_conclusion({"variants": {}}, CMP_CHUNK3, "sglang", 0.1) is None


def _lab_with_one_run(tmp: Path, before: str, after: str | None) -> Path:
    rdir = tmp / "v" / "runs" / "r1"
    rdir.mkdir(parents=True)
    (rdir / "metrics_before.prom").write_text(before)
    if after is not None:
        (rdir / "metrics_after.prom").write_text(after)
    (rdir / "meta.json").write_text('{"status": "completed"}')
    return rdir


def test_one_judge_the_quick_map_case_and_a_lab_run_get_the_same_verdict(tmp_path: Path) -> None:
    """Issue 13 item 1: the same two scrapes give the same verdict in meta.json (the bench_case action),
    summary.csv (analysis) and a lab variant (analysis/labs/load.py)."""
    import importlib.util

    from analysis import emulation
    from analysis.labs.load import read_variant
    from tests.enginesim.es_prom import ZERO, scrape

    spec = importlib.util.spec_from_file_location("qm_bench_case_j", REPO / "action_plugins/bench_case.py")
    action = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(action)
    variant = {"name": "v", "args": [], "runs": [{"name": "r1", "workload": {}}]}
    for i, (before, after) in enumerate(
        [
            (ZERO, scrape(10.0, 2.0, 20.1, 1000, late=5)),  # ok
            (ZERO, scrape(10.0, 2.0, 20.1, 1000, late=80)),  # degraded
            (ZERO, scrape(10.0, 2.0, 25.0, 1000)),  # saturated
            (ZERO, None),  # unknown: no after scrape
        ]
    ):
        lab = tmp_path / str(i)
        rdir = _lab_with_one_run(lab, before, after)
        meta = action._emulation(rdir)
        row: dict = {}
        emulation.attach(row, rdir)
        v = read_variant(lab, variant)
        assert meta["verdict"] == row["emulation_verdict"] == v.realtime, (i, meta, row, v.realtime)
        assert v.realtime_detail["reads"] == {"r1": "scrapes"}


def test_each_lab_run_is_judged_from_its_own_scrapes_and_the_worst_run_wins(tmp_path: Path) -> None:
    from analysis.labs import realtime
    from analysis.labs.load import read_variant
    from tests.enginesim.es_prom import ZERO, scrape

    _lab_with_one_run(tmp_path, ZERO, scrape(10.0, 2.0, 20.1, 1000, late=5))
    slow = tmp_path / "v" / "runs" / "r2"
    slow.mkdir()
    (slow / "metrics_before.prom").write_text(ZERO)
    (slow / "metrics_after.prom").write_text(scrape(10.0, 2.0, 25.0, 1000))
    bare = tmp_path / "v" / "runs" / "r3"  # no scrapes: judged by the fallback reader, and said so
    bare.mkdir()
    runs = [{"name": n, "workload": {}} for n in ("r1", "r2", "r3")]
    v = read_variant(tmp_path, {"name": "v", "args": [], "runs": runs})
    assert v.realtime == "saturated" and "r2: saturated" in v.realtime_reason
    assert v.realtime_detail["runs"]["r1"]["verdict"] == "ok"
    assert v.realtime_detail["reads"] == {"r1": "scrapes", "r2": "scrapes"}  # r3 did not complete
    # a completed run without scrapes on an emulated server falls back to the schedule lag, and says so
    detail = realtime.variant_verdict(
        {"r1": (tmp_path / "v" / "runs" / "r1", True), "r3": (bare, True)},
        {"sched_lag_ms": {"p50": 0.1, "p99": 1.0, "max": 2.0}},
    )
    assert detail[0] == "ok" and detail[2]["reads"] == {"r1": "scrapes", "r3": realtime.FALLBACK}
    pit = realtime.reads_pitfall("v", detail[2])
    assert pit.startswith("VERDICT_READS v:") and "r3" in pit and "r1" not in pit
    # a variant with no run at all (fp8_kv: start-up only) is judged on its server life, and says so
    verdict, _, detail = realtime.variant_verdict({}, {"sched_lag_ms": {"p50": 0.1, "p99": 1.0, "max": 2.0}})
    assert verdict == "ok" and "ran no load" in realtime.reads_pitfall("kv_fp8", detail)
    assert realtime.variant_verdict({}, None)[0] is None  # a real engine: no verdict


def test_a_labs_realtime_verdict_combines_its_variants() -> None:
    from analysis.labs import realtime

    ok = ("ok", {"stands": {"tpot": True, "throughput": True, "ttft": True, "itl_tail": True}})
    tail = ("degraded", {"stands": {"tpot": True, "throughput": True, "ttft": True, "itl_tail": False}})
    got = realtime.lab_verdict({"a": ok, "b": tail, "real": (None, {})})
    assert got == {"verdict": "degraded", "stands": tail[1]["stands"]}
    assert realtime.lab_verdict({"a": ok, "b": ("unknown", {})})["verdict"] == "unknown"
    assert realtime.lab_verdict({"real": (None, {})}) is None
