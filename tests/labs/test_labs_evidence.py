"""analysis/evidence parsers on real SGLang / vLLM output (tests/labs/fixtures, README there)."""

from __future__ import annotations

import pytest
from conftest import sample, samples

from analysis.errors import InputError
from analysis.evidence import events, honesty, prom, requests, startup

# ---------------------------------------------------------------- Prometheus text


def test_every_real_exposition_sample_parses_with_prometheus_client() -> None:
    parsed = 0
    for name in ("sglang_metrics.txt", "vllm_metrics.txt"):
        for src, text in samples(name):
            if "| " in text or "metrics.py" in text or "loggers.py" in text:
                continue  # a Prometheus-UI table and log lines, not exposition (tested below)
            scrape = prom.parse(text, src)
            assert scrape.types, src
            parsed += 1
    assert parsed >= 9


def test_counter_samples_keep_the_name_the_server_wrote_and_labels_are_summed_or_maxed() -> None:
    text = sample("sglang_metrics.txt", "aibrix issue #1614")
    scrape = prom.parse(text)
    assert scrape.total("sglang:num_retracted_reqs") == 0.0
    assert len(scrape.values["sglang:num_retracted_reqs"]) == 4  # one per dp_rank seen in the excerpt
    v10 = prom.parse(sample("vllm_metrics.txt", "production-stack issue #617"))
    assert v10.total("vllm:prefix_cache_queries_total") == 32.0
    assert v10.peak("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") == pytest.approx(
        9.75010481363281e-06
    )
    assert not any(k.endswith("_created") for k in v10.values)  # creation stamps are not measurements


def test_families_declared_without_samples_are_tolerated() -> None:
    scrape = prom.parse(sample("vllm_metrics.txt", "MeetKai/functionary PR #263"))
    assert "vllm:num_requests_running" in scrape.types
    assert scrape.total("vllm:num_preemptions_total") is None


def test_a_prometheus_ui_table_is_refused_not_misread() -> None:
    text = sample("vllm_metrics.txt", "PR #24049")
    with pytest.raises(InputError, match="not Prometheus text"):
        prom.parse(text, "ui-table")


def test_counter_delta_and_a_counter_that_first_appears_after() -> None:
    before = prom.parse('sglang:cached_tokens_total{model_name="m"} 10.0\n')
    after = prom.parse(
        'sglang:cached_tokens_total{model_name="m"} 2090.0\n'
        'sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 3.0\n'
    )
    assert prom.delta(before, after, "sglang:cached_tokens_total") == 2080.0
    assert prom.delta(before, after, "sglang:num_retracted_requests_total") == 3.0
    assert prom.delta(None, after, "sglang:cached_tokens_total") is None
    assert prom.delta(before, after, "vllm:num_preemptions_total") is None


def test_sampler_file_is_cut_at_its_markers_and_a_torn_last_scrape_is_dropped(tmp_path) -> None:
    f = tmp_path / "metrics_samples.prom"
    f.write_text(
        '# quickmap-sample 100.0\nvllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_requests_waiting 3\n'
        '# quickmap-sample 100.5\nvllm:kv_cache_usage_perc{engine="0"} 0.97\nvllm:num_requests_waiting 7\n'
        '# quickmap-sample 101.0\nvllm:kv_cache_usage_perc{engine="0"} 0.9'  # cut mid-line by the kill
        '\nvllm:num_requests_waiting{a="'
    )
    scrapes = prom.read_samples(f)
    assert [s.time for s in scrapes] == [100.0, 100.5]
    assert prom.series(scrapes, "peak", "vllm:kv_cache_usage_perc") == [(100.0, 0.5), (100.5, 0.97)]
    assert prom.series(scrapes, "total", "vllm:num_requests_waiting") == [(100.0, 3.0), (100.5, 7.0)]


# ---------------------------------------------------------------- start-up capacity


def test_sglang_capacity_lines_in_every_form() -> None:
    caps = [startup.sglang_capacity(text) for _, text in samples("sglang_startup_kv.txt")]
    tokens = [c.tokens if c else None for c in caps]
    assert tokens == [46611, 1029388, 4096, 367404, 975424, 665690]
    assert caps[0].source == "kv_allocated"
    assert caps[-1].source == "max_total_num_tokens"  # the docs sample has only the scheduler line
    assert caps[2].kv_dtype == "torch.float8_e5m2"
    assert caps[1].kv_dtype == "torch.bfloat16"


def test_vllm_capacity_lines_merged_duplicated_and_coloured() -> None:
    got = {src.split("(")[0][10:60]: startup.vllm_capacity(t) for src, t in samples("vllm_startup_kv.txt")}
    tokens = [c.tokens for c in got.values() if c is not None]
    assert 652144 in tokens and 230528 in tokens and 2640144 in tokens  # plain, fp8 run, ANSI + 4x duplicate
    merged = startup.vllm_capacity(sample("vllm_startup_kv.txt", "library file id 70231782181"))
    assert (merged.tokens, merged.max_concurrency, merged.concurrency_len) == (460496, 3.51, 131072)
    summary = startup.vllm_capacity(sample("vllm_startup_kv.txt", "NVIDIA-NeMo/RL PR #1212"))
    assert summary.tokens == 249952  # first of the bf16 / fp8 pair the user quoted
    assert startup.vllm_capacity(sample("vllm_startup_kv.txt", "PR #12569")) is None  # V0 blocks only
    assert startup.vllm_blocks(sample("vllm_startup_kv.txt", "PR #12569")) == 1381


def test_fp8_platform_notes_are_quoted() -> None:
    notes = startup.fp8_notes(sample("quant_kernel_selection.txt", "club-3090 PR #594"))
    assert any("does not have native support for FP8" in n for n in notes)
    assert any("Using KV cache scaling factor" in n for n in notes)


# ---------------------------------------------------------------- run-time lines


def test_retraction_and_preemption_lines_in_every_wording() -> None:
    ev = events.scan(sample("preemption_retraction_warnings.txt", "issue #2746"))
    assert ev.retractions == 5 and len(ev.retraction_lines) == 5
    assert ev.max_kv_usage == 1.0  # the Decode batch lines before the retraction
    newer = events.scan(sample("preemption_retraction_warnings.txt", "docs/advanced_features/hyperparameter"))
    assert newer.retractions == 1
    oldest = events.scan(sample("preemption_retraction_warnings.txt", "docs/backend/hyperparameter"))
    assert oldest.retractions == 1
    v0 = [
        events.scan(t).preemption_warnings
        for s, t in samples("preemption_retraction_warnings.txt")
        if "vllm" in s.lower() or "LIMO" in s or "cookbook" in s
    ]
    assert sum(v0) == 6


def test_vllm_v1_stats_line_gives_kv_usage_and_preemptions() -> None:
    line = (
        "INFO 09-26 11:20:52 [loggers.py:127] Engine 000: Avg prompt throughput: 6102.8 tokens/s, Avg "
        "generation "
        "throughput: 1221.7 tokens/s, Running: 259 reqs, Waiting: 535 reqs, GPU KV cache usage: 82.3%, "
        "Prefix "
        "cache hit rate: 32.2%"
    )
    ev = events.scan(line + "\n" + line.replace("Waiting: 535 reqs,", "Waiting: 535 reqs, Preemptions: 4,"))
    assert ev.max_kv_usage == pytest.approx(0.823)
    assert ev.stats_preemptions == 4
    assert events.scan(sample("vllm_metrics.txt", "issue #25780")).max_kv_usage == pytest.approx(0.823)


# ---------------------------------------------------------------- per request and speculation


def _req(out: int, spec: dict) -> dict:
    return {"index": 0, "success": True, "output_tokens": out, "spec": spec}


def test_sglang_acceptance_from_real_meta_info_old_and_new_names() -> None:
    old = {
        "spec_accept_rate": 0.011702127659574468,
        "spec_accept_length": 1.0638297872340425,
        "spec_verify_ct": 188,
        "spec_accept_token_num": 11,
        "spec_draft_token_num": 940,
    }  # sglang PR #13754, completion_tokens 200
    acc = requests.sglang_acceptance([_req(200, old)])
    assert acc.accept_length == pytest.approx(old["spec_accept_length"])  # bonus token included: 200 / 188
    assert acc.accept_rate == pytest.approx(11 / 940)
    new = {
        "spec_accept_rate": 0.2930232558139535,
        "spec_accept_length": 2.4651162790697674,
        "spec_num_correct_drafts": 63,
        "spec_num_proposed_drafts": 215,
        "spec_verify_ct": 43,
    }  # PR #33518, 106 out
    acc = requests.sglang_acceptance([_req(106, new)])
    assert acc.accept_length == pytest.approx(new["spec_accept_length"])
    assert acc.accept_rate == pytest.approx(new["spec_accept_rate"])
    assert "spec_num_correct_drafts" in sample("sglang_generate_meta_info.txt", "PR #33518")
    assert requests.sglang_acceptance([{"index": 0, "success": True, "output_tokens": 5}]) is None


def test_vllm_acceptance_counts_the_bonus_token() -> None:
    # SpecDecoding log line of vLLM PR #24127: Accepted 262, Drafted 295 tokens at k=5 -> 59 drafts,
    # "Mean acceptance length: 5.44" = 1 + 262/59.
    acc = requests.vllm_acceptance(
        {
            "vllm:spec_decode_num_drafts_total": 59.0,
            "vllm:spec_decode_num_draft_tokens_total": 295.0,
            "vllm:spec_decode_num_accepted_tokens_total": 262.0,
        }
    )
    assert acc.accept_length == pytest.approx(5.44, abs=0.005)
    assert acc.accept_rate == pytest.approx(0.888, abs=0.001)
    assert "Mean acceptance length: 5.44" in sample("vllm_metrics.txt", "PR #24127")
    assert requests.vllm_acceptance({"vllm:spec_decode_num_drafts_total": 0.0}) is None


def test_read_result_refuses_other_schemas(tmp_path) -> None:
    f = tmp_path / "bench.json"
    f.write_text('{"completed": 3}')
    with pytest.raises(InputError, match=r"quickmap\.loadgen/1"):
        requests.read_result(f)
    assert requests.read_result(tmp_path / "missing.json") is None


# ---------------------------------------------------------------- the emulator's honesty


def test_realtime_verdicts() -> None:
    ok = honesty.emulator_evidence(
        {"enginesim": {"sched_lag_ms": {"p50": 0.1, "p99": 4.0, "max": 6.0}}}, None
    )
    assert honesty.realtime_verdict(ok)[0] == "ok"
    slipped = {"sched_lag_ms": {"p50": 0.2, "p99": 9.0, "max": 113.0}}
    assert honesty.realtime_verdict(slipped)[0] == "degraded"
    behind = {"sched_lag_ms": {"p50": 8.0, "p99": 351.0, "max": 442.0}}
    assert honesty.realtime_verdict(behind)[0] == "saturated"
    assert honesty.realtime_verdict(None) == (None, "not emulated")
    from_log = honesty.emulator_evidence(
        None, "x\nenginesim: sched_lag_ms p50=0.5 p99=3.1 max=4.2 steps=10 events=9\n"
    )
    assert from_log["sched_lag_ms"] == {"p50": 0.5, "p99": 3.1, "max": 4.2}
    assert honesty.emulator_evidence({"version": "0.5.6"}, "a real engine's log") is None


def test_loadgen_keeps_sglangs_spec_fields_per_request() -> None:
    """The n-gram lab reads spec_* per request from loadgen's result: the worker's record carries them."""
    from loadgen.records import RequestRecord
    from loadgen.results import request_record

    spec = {"spec_verify_ct": 40, "spec_accept_length": 3.37}
    base = (0, 0, 0, 1, 11, 200, None, None, [5, 11], [1, 1], 2, 8, "server", 0, 5, 0)
    assert request_record(RequestRecord(*base, spec), 0, False)["spec"] == spec
    assert "spec" not in request_record(RequestRecord(*base), 0, False)
