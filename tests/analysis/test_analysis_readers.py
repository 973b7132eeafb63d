"""Readers: every client format and layout, unit conversions, every recompute fallback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from qm_analysis_synth import FIXTURES, dump_sglang, loadgen_result, sglang_result

from analysis.errors import InputError
from analysis.rawload import load_result, load_sglang_summary, parse_json_bytes
from analysis.readers import describe, read_bench

DETAILS = FIXTURES / "sglang-0.5.23_c32_details.jsonl"
SUMMARY = FIXTURES / "sglang-0.5.23_c64_summary.jsonl"


def _strip_keys(obj: dict, prefixes: tuple[str, ...]) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith(prefixes)}


def _load_fixture(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------- real SGLang files


def test_real_sglang_details_full_decode_matches_tool_summary() -> None:
    d = read_bench(DETAILS, want_requests=True)
    raw = _load_fixture(DETAILS)
    assert d.format == "sglang" and d.per_request_arrays == "present"
    assert d.scalars["completed"] == 96 and d.scalars["failed"] == 0
    assert d.scalars["request_rate"] == math.inf  # SGLang's bare Infinity token
    assert d.stats["ttft_p95_ms"] == raw["p95_ttft_ms"]  # tool figure, not recomputed
    assert d.stats["ttft_p50_ms"] == raw["median_ttft_ms"]
    # per-request arrays are seconds in the file, ms here
    assert d.ttft_ms is not None and d.ttft_ms.size == 96
    np.testing.assert_allclose(d.ttft_ms, np.array(raw["ttfts"]) * 1000)
    # recomputed from the arrays agrees with the tool (E2E via TTFT + sum(ITLs): within the [DONE] tail)
    assert np.mean(d.ttft_ms) == pytest.approx(raw["mean_ttft_ms"], rel=1e-9)
    assert np.mean(d.tpot_ms) == pytest.approx(raw["mean_tpot_ms"], rel=1e-3)
    assert np.mean(d.e2e_ms) == pytest.approx(raw["mean_e2e_latency_ms"], rel=1e-3)


def test_real_sglang_details_fast_path_equals_full_decode() -> None:
    fast = load_sglang_summary(DETAILS)
    assert fast is not None and fast.layout == "jsonl-summary"
    a = read_bench(DETAILS)  # fast path
    assert a.per_request_arrays.startswith("not decoded")
    b = read_bench(DETAILS, want_requests=True)
    assert a.stats == b.stats and a.scalars == b.scalars


def test_real_sglang_summary_only() -> None:
    d = read_bench(SUMMARY, want_requests=True)
    assert d.format == "sglang" and d.per_request_arrays == "absent"
    assert d.scalars["completed"] == 256 and d.scalars["failed"] is None
    assert d.sources == {"ttft": "tool", "tpot": "tool", "itl": "tool", "e2e": "tool", "itl_event": "missing"}
    assert d.ttft_ms is None


def test_recompute_when_summary_keys_missing_real_file(tmp_path: Path) -> None:
    raw = _load_fixture(DETAILS)
    stripped = _strip_keys(raw, ("mean_", "median_", "std_", "p90_", "p95_", "p99_"))
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(stripped) + "\n")
    d = read_bench(p)
    assert d.sources == {**{m: "recomputed" for m in ("ttft", "tpot", "itl", "e2e")}, "itl_event": "missing"}
    ttft = np.array(raw["ttfts"]) * 1000
    itls = [np.array(x) * 1000 for x in raw["itls"]]
    assert d.stats["ttft_p99_ms"] == pytest.approx(np.percentile(ttft, 99))
    assert d.stats["ttft_std_ms"] == pytest.approx(ttft.std())
    # E2E = TTFT + sum(ITLs); TPOT = per-request ITL mean; ITL = all per-token gaps
    e2e = ttft + np.array([x.sum() for x in itls])
    tpot = np.array([x.mean() for x in itls])
    assert d.stats["e2e_p90_ms"] == pytest.approx(np.percentile(e2e, 90))
    assert d.stats["tpot_median_ms"] == pytest.approx(np.median(tpot))
    assert d.stats["itl_p95_ms"] == pytest.approx(np.percentile(np.concatenate(itls), 95))


def test_partially_missing_stats_are_filled_and_labelled(tmp_path: Path) -> None:
    raw = _load_fixture(DETAILS)
    del raw["p90_ttft_ms"]  # the late-2025 client had no p90
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps(raw))
    d = read_bench(p)
    assert d.sources["ttft"] == "tool+recomputed"
    assert d.stats["ttft_p90_ms"] == pytest.approx(np.percentile(np.array(raw["ttfts"]) * 1000, 90))
    assert d.stats["ttft_p95_ms"] == raw["p95_ttft_ms"]


def test_multiple_runs_in_one_jsonl_take_the_last(tmp_path: Path) -> None:
    first = json.loads(SUMMARY.read_text())
    second = dict(first, completed=7, mean_ttft_ms=1.5)
    p = tmp_path / "two.jsonl"
    p.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    d = read_bench(p)
    assert d.runs_in_file == 2 and d.scalars["completed"] == 7 and d.stats["ttft_mean_ms"] == 1.5


def test_failed_requests_are_excluded_from_arrays(tmp_path: Path) -> None:
    obj = sglang_result(n=30, n_failed=4)
    p = tmp_path / "b.jsonl"
    p.write_text(dump_sglang(_strip_keys(obj, ("mean_", "median_", "std_", "p9"))))
    d = read_bench(p, want_requests=True)
    assert d.scalars["completed"] == 26 and d.scalars["failed"] == 4
    np.testing.assert_allclose(np.sort(d.ttft_ms), np.sort(obj["_truth"]["ttft_ms"]))
    assert d.stats["itl_p99_ms"] == pytest.approx(np.percentile(obj["_truth"]["itl_ms"], 99))


# ---------------------------------------------------------------- vLLM


def _vllm(detailed: bool, old: bool = False) -> dict:
    rng = np.random.default_rng(5)
    n = 40
    ttfts = rng.gamma(5, 0.01, n)
    itls = [list(rng.gamma(20, 0.001, 15)) for _ in range(n)]
    lat = ttfts + np.array([sum(x) for x in itls])
    obj = {
        "date": "20261202-101010", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": "m", "tokenizer_id": "m", "num_prompts": n, "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": 8, "duration": 3.0, "completed": n, "failed": 0, "total_input_tokens": 100 * n,
        "total_output_tokens": 16 * n, "request_throughput": n / 3.0, "output_throughput": 16 * n / 3.0,
        "total_token_throughput": 116 * n / 3.0,
        "mean_ttft_ms": float(ttfts.mean() * 1000), "median_ttft_ms": float(np.median(ttfts) * 1000),
        "std_ttft_ms": float(ttfts.std() * 1000), "p99_ttft_ms": float(np.percentile(ttfts, 99) * 1000),
        "mean_tpot_ms": 1.0, "median_tpot_ms": 1.0, "std_tpot_ms": 0.1, "p99_tpot_ms": 2.0,
        "mean_itl_ms": 1.0, "median_itl_ms": 1.0, "std_itl_ms": 0.1, "p99_itl_ms": 2.0,
    }  # fmt: skip
    if old:
        obj["request_goodput:"] = None
        obj.pop("failed")
    else:
        obj["request_goodput"] = None
        obj["latencies"] = lat.tolist()
    if detailed:
        obj.update(input_lens=[100] * n, output_lens=[16] * n, ttfts=ttfts.tolist(), itls=itls,
                   generated_texts=["x"] * n, errors=[""] * n)  # fmt: skip
    obj["_lat_ms"] = lat * 1000
    obj["_ttft_ms"] = ttfts * 1000
    return obj


@pytest.mark.parametrize("detailed", [False, True])
def test_vllm_json_with_and_without_save_detailed(tmp_path: Path, detailed: bool) -> None:
    obj = _vllm(detailed)
    lat, ttft = obj.pop("_lat_ms"), obj.pop("_ttft_ms")
    p = tmp_path / "vllm.json"
    p.write_text(json.dumps(obj, indent=2))
    d = read_bench(p, want_requests=True)
    assert d.format == "vllm" and d.scalars["request_rate"] == math.inf
    assert d.scalars["total_throughput"] == pytest.approx(116 * 40 / 3.0)  # total_token_throughput
    assert d.scalars["input_throughput"] == pytest.approx(100 * 40 / 3.0)  # not written by vLLM: from totals
    assert d.stats["ttft_p99_ms"] == obj["p99_ttft_ms"]
    # E2E: vLLM writes no e2el stats by default; recomputed from `latencies` (seconds)
    assert d.sources["e2e"] == "recomputed"
    assert d.stats["e2e_p95_ms"] == pytest.approx(np.percentile(lat, 95))
    if detailed:  # TTFT p95 is not a default vLLM percentile: recomputed from ttfts
        assert d.stats["ttft_p95_ms"] == pytest.approx(np.percentile(ttft, 95))
        # TPOT per request = (E2E - TTFT)/(out - 1) when latencies and lengths are known
        assert d.tpot_ms is not None
        np.testing.assert_allclose(d.tpot_ms, (lat - ttft) / 15)
        # vLLM's itls are per streamed chunk: they feed itl_event, never the per-token ITL
        assert d.stats["itl_event_p95_ms"] == pytest.approx(
            np.percentile(np.concatenate([np.array(x) * 1000 for x in obj["itls"]]), 95)
        )
    else:
        assert math.isnan(d.stats["ttft_p95_ms"])
        assert d.sources["ttft"] == "tool"
    assert d.stats["itl_event_p99_ms"] == obj["p99_itl_ms"] and d.sources["itl"] == "missing"


def test_old_vllm_with_goodput_typo_key(tmp_path: Path) -> None:
    obj = _vllm(detailed=True, old=True)
    obj.pop("_lat_ms")
    obj.pop("_ttft_ms")
    p = tmp_path / "old.json"
    p.write_text(json.dumps(obj))
    d = read_bench(p, want_requests=True)
    assert d.format == "vllm"
    assert d.scalars["failed"] == 0  # no `failed` key: counted from `errors`
    assert d.sources["e2e"] == "recomputed"  # no latencies: E2E = TTFT + sum(ITLs)
    ttft = np.array(obj["ttfts"]) * 1000
    e2e = ttft + np.array([sum(x) for x in obj["itls"]]) * 1000
    assert d.stats["e2e_mean_ms"] == pytest.approx(e2e.mean())


# ---------------------------------------------------------------- loadgen + log layout


def test_loadgen_result_and_timeline(tmp_path: Path) -> None:
    obj = loadgen_result(n=20, osl=8, n_failed=2, tokens_per_event=2)
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(obj))
    d = read_bench(p, want_requests=True)
    assert d.format == "loadgen" and d.complete is True and d.reliable is True
    assert d.scalars["completed"] == 18 and d.scalars["failed"] == 2
    ok = [r for r in obj["requests"] if r["success"]]
    np.testing.assert_allclose(d.ttft_ms, [r["ttft_ms"] for r in ok])
    np.testing.assert_allclose(d.tpot_ms, [r["tpot_ms"] for r in ok])
    # per-token ITL from *_itl_per_token_ms / `itls`; per-event ITL from *_itl_ms
    assert d.stats["itl_event_p95_ms"] == obj["p95_itl_ms"]
    assert d.stats["itl_p99_ms"] == obj["p99_itl_per_token_ms"] and d.sources["itl"] == "tool+recomputed"
    per_token = np.concatenate([np.repeat(np.diff(r["event_times_s"]) / 2, 2) for r in ok]) * 1000
    assert d.stats["itl_p95_ms"] == pytest.approx(np.percentile(per_token, 95))
    per_event = np.concatenate([np.diff(r["event_times_s"]) for r in ok]) * 1000
    assert d.stats["itl_event_p95_ms"] == pytest.approx(np.percentile(per_event, 95))
    epoch, itl = d.timeline
    # 4 events per request (2 tokens each): 3 gaps each, each split over the event's 2 tokens
    assert epoch.size == 18 * 3
    r0 = ok[0]
    gap0 = (r0["event_times_s"][1] - r0["event_times_s"][0]) * 1000 / 2
    assert itl[0] == pytest.approx(gap0)
    assert epoch[0] == pytest.approx(obj["t0_epoch_s"] + r0["send_s"] + r0["event_times_s"][1])
    assert d.first_send_epoch_s == pytest.approx(
        obj["t0_epoch_s"] + min(r["send_s"] for r in obj["requests"])
    )


def test_log_file_first_json_line_wins(tmp_path: Path) -> None:
    summary = json.loads(SUMMARY.read_text())
    p = tmp_path / "bench.log"
    p.write_text(
        "Namespace(backend='sglang')\n{not json at all\n"
        + json.dumps(summary)
        + "\n"
        + json.dumps(dict(summary, completed=1))
        + "\n============ Serving Benchmark Result ============\n"
    )
    loaded = load_result(p)
    assert loaded.layout == "log" and loaded.line == 3
    assert read_bench(p).scalars["completed"] == 256


def test_real_console_log_without_json_is_rejected() -> None:
    with pytest.raises(InputError) as exc:
        read_bench(FIXTURES / "sglang-0.5.23_c32_client.log")
    assert "no line holds a JSON result object" in str(exc.value)


def test_unsupported_client_json_is_rejected(tmp_path: Path) -> None:
    # AIPerf's summary is a supported result now (issue 17); its inputs.json is not a result at all.
    p = tmp_path / "inputs.json"
    p.write_text(json.dumps({"data": [{"session_id": "a5cd", "payloads": [{"messages": []}]}]}))
    with pytest.raises(InputError) as exc:
        read_bench(p)
    assert "not a recognised result" in str(exc.value)


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_sglang_file_is_an_error(tmp_path: Path, cut: float) -> None:
    data = DETAILS.read_bytes()
    p = tmp_path / "trunc.jsonl"
    p.write_bytes(data[: int(len(data) * cut)])
    assert load_sglang_summary(p) is None  # the fast path refuses a file without its tail
    with pytest.raises(InputError) as exc:
        read_bench(p)
    assert str(p) in str(exc.value) and "truncated" in str(exc.value)


def test_truncated_last_line_of_jsonl_names_the_line(tmp_path: Path) -> None:
    line = SUMMARY.read_text().strip()
    p = tmp_path / "b.jsonl"
    p.write_text(line + "\n" + line[:200] + "\n")
    with pytest.raises(InputError) as exc:
        read_bench(p)
    assert "line 2" in str(exc.value)


def test_empty_missing_and_non_object(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    for name, needle in (("empty.json", "empty"), ("list.json", "JSON object"), ("nope.json", "not found")):
        with pytest.raises(InputError) as exc:
            read_bench(tmp_path / name)
        assert needle in str(exc.value)


def test_nonfinite_tokens_only_rewritten_in_value_position() -> None:
    obj = parse_json_bytes(
        b'{"a": Infinity, "b": [1, -Infinity], "c": NaN, "d": "x, Infinity, y", "e": "NaN"}'
    )
    assert obj["a"] == math.inf and obj["b"] == [1, -math.inf] and math.isnan(obj["c"])
    assert obj["d"] == "x, Infinity, y" and obj["e"] == "NaN"


def test_describe_matches_numpy_linear_percentiles() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 1000):
        a = rng.lognormal(size=n)
        s = describe(a)
        for q in (50, 90, 95, 99):
            assert s[f"p{q}"] == np.percentile(a, q, method="linear")
        assert s["median"] == np.median(a) and s["std"] == a.std() and s["mean"] == pytest.approx(a.mean())


def test_nonfinite_in_a_big_document_head_and_tail() -> None:
    big = [0.5] * 40_000  # > 64 KiB of JSON
    head_only = b'{"request_rate": Infinity, "x": ' + json.dumps(big).encode() + b"}"
    assert parse_json_bytes(head_only)["request_rate"] == math.inf
    both = b'{"request_rate": Infinity, "x": ' + json.dumps(big).encode() + b', "std": NaN}'
    obj = parse_json_bytes(both)  # the head rewrite is not enough: falls back to the whole buffer
    assert obj["request_rate"] == math.inf and math.isnan(obj["std"]) and len(obj["x"]) == 40_000
