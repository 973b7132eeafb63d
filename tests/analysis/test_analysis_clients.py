"""Every common client's results (issue 17): guidellm, AIPerf (summary and per-request JSONL), vLLM
``bench serve`` (with and without details) and SGLang's JSONL, on the same summary columns, each
figure only where the client's definition is ours; a flat directory; unreadable files listed; an
empty or wrong directory refused (issue 11)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from qm_analysis_synth import FIXTURES

from analysis.readers import read_bench

GUIDELLM = FIXTURES / "guidellm-0.8.1_c64_benchmarks.json"
AIPERF = FIXTURES / "aiperf-0.13.0_c64_profile_export_aiperf.json"
AIPERF_RECORDS = FIXTURES / "aiperf-constructed_profile_export.jsonl"
VLLM = FIXTURES / "vllm-bench-serve_constructed.json"
VLLM_DETAILED = FIXTURES / "vllm-bench-serve_constructed_detailed.json"
SGLANG = FIXTURES / "sglang-0.5.23_c32_details.jsonl"
SGLANG_SUMMARY = FIXTURES / "sglang-0.5.23_c64_summary.jsonl"
OUTPUTS = ("summary.csv", "summary.jsonl", "aggregate.csv", "ab.csv", "report.md")


def test_guidellm_real_file_tpot_is_its_inter_token_latency_not_its_tpot() -> None:
    d = read_bench(GUIDELLM, want_requests=True)
    bench = json.loads(GUIDELLM.read_text())["benchmarks"][-1]
    recs = bench["requests"]["successful"]
    assert (d.format, d.client) == ("guidellm", "guidellm 0.8.1")
    assert d.scalars["completed"] == 256 and d.scalars["failed"] == 0
    assert d.scalars["duration_s"] == bench["duration"]
    assert d.scalars["output_throughput"] == pytest.approx(32768 / bench["duration"])
    itl = np.array([r["inter_token_latency_ms"] for r in recs])
    tpot_incl_ttft = np.array([r["time_per_output_token_ms"] for r in recs])
    assert d.stats["tpot_mean_ms"] == pytest.approx(itl.mean())  # (last - first token)/(n - 1)
    assert abs(d.stats["tpot_mean_ms"] - tpot_incl_ttft.mean()) > 0.2  # guidellm's TPOT includes TTFT
    ttft = np.array([r["time_to_first_token_ms"] for r in recs])
    assert d.stats["ttft_p95_ms"] == pytest.approx(np.percentile(ttft, 95))  # linear, not nearest-rank
    assert d.stats["e2e_p50_ms"] == pytest.approx(np.median([r["request_latency"] * 1000 for r in recs]))
    assert d.sources["ttft"] == "recomputed" and d.sources["itl"] == "missing"
    assert np.isnan(d.stats["itl_p95_ms"]) and np.isnan(d.stats["itl_event_p95_ms"])
    assert d.facts["output_lens"] == [128] * 256 and d.facts["nonfinite"] == []
    assert len(d.requests["ttft_ms"]) == 256


def test_aiperf_real_summary_maps_its_itl_to_tpot_and_its_chunk_latency_to_itl_event() -> None:
    d = read_bench(AIPERF)
    doc = json.loads(AIPERF.read_text())
    assert (d.format, d.client) == ("aiperf", "aiperf 0.13.0")
    assert d.scalars["completed"] == 256 and d.scalars["failed"] == 0
    assert d.stats["ttft_p95_ms"] == doc["time_to_first_token"]["p95"]
    assert d.stats["ttft_median_ms"] == doc["time_to_first_token"]["p50"]
    assert d.stats["tpot_p99_ms"] == doc["inter_token_latency"]["p99"]  # AIPerf's "ITL" is a TPOT
    assert d.stats["itl_event_mean_ms"] == doc["inter_chunk_latency"]["avg"]
    assert d.stats["e2e_p90_ms"] == doc["request_latency"]["p90"]
    assert np.isnan(d.stats["itl_p95_ms"])  # no per-token ITL in AIPerf
    assert np.isnan(d.stats["ttft_std_ms"])  # AIPerf's std is the sample std: not ours, not copied
    assert d.scalars["output_throughput"] == doc["output_token_throughput"]["avg"]


def test_aiperf_per_request_jsonl_profiling_phase_only() -> None:
    d = read_bench(AIPERF_RECORDS, want_requests=True)
    recs = [json.loads(line) for line in AIPERF_RECORDS.read_text().splitlines()]
    prof = [r for r in recs if r["metadata"]["benchmark_phase"] == "profiling"]
    ok = [r for r in prof if r["error"] is None]
    assert d.format == "aiperf_records" and d.runs_in_file == 1
    assert d.scalars["completed"] == len(ok) == 5 and d.scalars["failed"] == 1  # warm-up record left out
    span = max(r["metadata"]["request_end_ns"] for r in prof) - min(
        r["metadata"]["request_start_ns"] for r in prof
    )
    assert d.scalars["duration_s"] == pytest.approx(span / 1e9)
    assert d.stats["ttft_mean_ms"] == pytest.approx(
        np.mean([r["metrics"]["time_to_first_token"]["value"] for r in ok])
    )
    chunks = np.concatenate([r["metrics"]["inter_chunk_latency"]["value"] for r in ok])
    assert d.stats["itl_event_p90_ms"] == pytest.approx(np.percentile(chunks, 90))
    assert list(d.requests["success"]) == [True, True, True, False, True, True]
    assert np.isnan(d.requests["ttft_ms"][3])


@pytest.mark.parametrize("path", [VLLM, VLLM_DETAILED], ids=["summary", "save-detailed"])
def test_vllm_bench_serve_failed_request_left_out_of_e2e(path: Path) -> None:
    d = read_bench(path, want_requests=True)
    doc = json.loads(path.read_text())
    ok = [lat for lat in doc["latencies"] if lat > 0]
    assert d.format == "vllm" and d.scalars["completed"] == 7 and d.scalars["failed"] == 1
    assert d.stats["e2e_mean_ms"] == pytest.approx(np.mean(ok) * 1000)  # the failure's 0.0 is no latency
    assert d.stats["itl_event_p99_ms"] == doc["p99_itl_ms"] and np.isnan(d.stats["itl_p99_ms"])
    assert list(d.requests["success"]) == [True] * 5 + [False] + [True] * 2


def _flat_dir(tmp_path: Path) -> Path:
    run = tmp_path / "peers"
    run.mkdir()
    for src in (GUIDELLM, AIPERF, VLLM, VLLM_DETAILED, SGLANG, SGLANG_SUMMARY):
        shutil.copy(src, run / src.name)
    shutil.copy(FIXTURES / "sglang-0.5.23_c32_client.log", run / "sglang-0.5.23_c32_client.log")
    (run / "README.md").write_text("not a result\n")
    return run


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_a_flat_directory_of_every_client_is_summarised_and_the_unreadable_file_listed(tmp_path, cli) -> None:
    run = _flat_dir(tmp_path)
    code, _, err = cli("summarize", run)
    log = run / "sglang-0.5.23_c32_client.log"
    assert code == 3, err  # written, but something was unreadable
    assert f"unreadable result {log}: no line holds a JSON result object" in err
    rows = {r["case_id"]: r for r in _rows(run / "summary.csv")}
    assert set(rows) == {p.name for p in run.iterdir() if p.suffix in (".json", ".jsonl", ".log")} - set(
        OUTPUTS
    )
    assert rows[log.name]["status"] == "unreadable"
    clients = {name: (r["status"], r["source_client"]) for name, r in rows.items() if name != log.name}
    assert clients[GUIDELLM.name] == ("unknown", "guidellm 0.8.1")
    assert clients[AIPERF.name] == ("unknown", "aiperf 0.13.0")
    assert {c for _, c in clients.values()} == {"guidellm 0.8.1", "aiperf 0.13.0", "vllm", "sglang"}
    assert float(rows[GUIDELLM.name]["ttft_p95_ms"]) > 0 and rows[AIPERF.name]["itl_p95_ms"] == ""
    agg = _rows(run / "aggregate.csv")
    assert {a["source_client"] for a in agg} == {"guidellm 0.8.1", "aiperf 0.13.0", "vllm", "sglang"}
    text = (run / "report.md").read_text()
    assert "1 result file(s) could not be read" in text and f"`{log}`: no line holds" in text
    assert "## Result files" in text and f"`{GUIDELLM.name}`" in text
    table = text[text.index("| column | our definition |") :]
    assert "includes TTFT and is not used" in table and "AIPerf's `inter_token_latency`" in table
    assert table.splitlines()[0] == "| column | our definition | sglang | vllm | guidellm | aiperf |"


def test_aiperf_summary_and_its_records_beside_it_are_one_run(tmp_path, cli) -> None:
    run = tmp_path / "artifacts"
    run.mkdir()
    shutil.copy(AIPERF, run / "profile_export_aiperf.json")
    shutil.copy(AIPERF_RECORDS, run / "profile_export.jsonl")
    code, _, err = cli("summarize", run)
    assert code == 0, err
    (row,) = _rows(run / "summary.csv")
    assert row["case_id"] == "profile_export_aiperf.json" and row["per_request_arrays"] == "present"
    assert row["source_client"] == "aiperf 0.13.0 + per-request records"
    doc = json.loads(AIPERF.read_text())
    assert float(row["ttft_p95_ms"]) == doc["time_to_first_token"]["p95"]  # the summary's figure
    assert row["ttft_std_ms"] != "" and row["ttft_source"] == "tool+recomputed"  # std from the records


@pytest.mark.parametrize("content", [None, "notes.txt", "other.csv"], ids=["empty", "no-results", "wrong"])
def test_an_empty_or_wrong_directory_is_exit_2_and_writes_nothing(tmp_path, cli, content) -> None:
    run = tmp_path / "d"
    run.mkdir()
    if content:
        (run / content).write_text("x\n")
    code, _, err = cli("summarize", run)
    assert code == 2 and str(run) in err and "no result file" in err
    assert sorted(p.name for p in run.iterdir()) == ([content] if content else [])


def test_nonfinite_result_of_a_completed_case_is_failed_with_the_reason(tmp_path, cli) -> None:
    from qm_analysis_synth import make_run

    run = make_run(tmp_path, reps=1)
    bench = run / "cases" / "short_c8" / "rep1" / "bench.json"
    bench.write_text(bench.read_text().replace('"duration": ', '"duration": Infinity, "was_duration": ', 1))
    code, _, err = cli("summarize", run)
    assert code == 0, err
    c8 = next(r for r in _rows(run / "summary.csv") if r["case_id"] == "short_c8")
    assert c8["status"] == "failed" and c8["error_type"] == "BENCH_FAILED" and c8["reliable"] == "False"
    assert "non-finite value (NaN or Infinity) in duration" in c8["reason"]
    assert "short_c8" not in {a["case_id"] for a in _rows(run / "aggregate.csv")}
