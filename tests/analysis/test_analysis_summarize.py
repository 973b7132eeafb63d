"""summarize end to end on small synthetic runs: outputs, statuses, A/B, plots, bad input."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from qm_analysis_synth import FIXTURES, make_run

OUTPUTS = ("summary.csv", "summary.jsonl", "aggregate.csv", "report.md")


@pytest.fixture(scope="module")
def summarized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analysis.summarize import summarize

    run = make_run(tmp_path_factory.mktemp("e2e"))
    summarize(run)
    return run


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_all_outputs_written(summarized: Path) -> None:
    for name in OUTPUTS:
        assert (summarized / name).stat().st_size > 0
    pngs = sorted(p.name for p in (summarized / "plots").glob("*.png"))
    assert pngs == ["ab_comparison.png", "latency_p95.png", "mixed_itl_rep1.png", "mixed_itl_rep2.png",
                    "throughput.png"]  # fmt: skip
    for p in (summarized / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(summarized.rglob("*.tmp"))


def test_summary_rows_statuses_and_values(summarized: Path) -> None:
    rows = _rows(summarized / "summary.csv")
    assert len(rows) == 11  # 2 fixed cases x 2 reps + 2 mixed reps x 3 roles + 1 foreign
    jl = [json.loads(line) for line in (summarized / "summary.jsonl").read_text().splitlines()]
    assert [r["case_id"] for r in jl] == [r["case_id"] for r in rows]
    foreign = next(r for r in rows if r["case_id"] == "foreign_sglang")
    assert foreign["status"] == "unknown" and foreign["source_format"] == "sglang"
    assert foreign["isl"] == "64" and foreign["concurrency"] == "16"  # workload from the file itself
    c8 = next(r for r in rows if r["case_id"] == "short_c8" and r["rep"] == "1")
    bench = json.loads((summarized / "cases" / "short_c8" / "rep1" / "bench.json").read_text())
    assert c8["status"] == "completed" and c8["completed"] == "40" and c8["failed"] == "0"
    assert float(c8["ttft_p95_ms"]) == bench["p95_ttft_ms"]
    assert float(c8["output_throughput"]) == bench["output_throughput"]


def test_aggregate_over_repetitions(summarized: Path) -> None:
    agg = _rows(summarized / "aggregate.csv")
    row = next(a for a in agg if a["case_id"] == "short_c8" and a["metric"] == "output_throughput")
    benches = [summarized / "cases" / "short_c8" / f"rep{i}" / "bench.json" for i in (1, 2)]
    vals = np.array([json.loads(b.read_text())["output_throughput"] for b in benches])
    assert row["n_reps"] == "2" and row["n_unknown"] == "0"
    assert float(row["mean"]) == pytest.approx(vals.mean())
    assert float(row["std"]) == pytest.approx(vals.std(ddof=1))
    assert float(row["cv"]) == pytest.approx(vals.std(ddof=1) / vals.mean())
    assert vals.min() <= float(row["ci95_low"]) <= float(row["ci95_high"]) <= vals.max()
    one = next(a for a in agg if a["case_id"] == "foreign_sglang" and a["metric"] == "ttft_p95_ms")
    assert one["n_reps"] == "1" and one["ci95_low"] == "" and one["std"] == ""  # undefined with one rep


def test_ab_table_detects_the_injected_slowdown(summarized: Path) -> None:
    ab = {r["metric"]: r for r in _rows(summarized / "ab.csv")}
    assert set(ab) == {"output tok/s", "TTFT", "TPOT", "E2E"}
    tpot = ab["TPOT"]
    assert float(tpot["change_pct"]) > 100 and float(tpot["ci95_low"]) > 0
    assert float(tpot["mann_whitney_p"]) < 1e-6 and tpot["verdict"] == "outside noise"
    assert tpot["control_requests"] == "80" and tpot["n_reps"] == "2"
    # TTFT is not slowed in the synthetic background: no claim of an effect
    assert ab["TTFT"]["verdict"] == "within noise"
    assert float(ab["output tok/s"]["change_pct"]) < 0


def test_report_carries_workload_statistic_and_unknown_note(summarized: Path) -> None:
    text = (summarized / "report.md").read_text()
    assert "status is **unknown**" in text and "foreign_sglang/rep1/bench.json" in text
    header = next(line for line in text.splitlines() if line.startswith("| case |"))
    for col in ("ISL", "OSL", "concurrency", "requests/rep", "reps", "TTFT p95", "TPOT p95", "E2E p95"):
        assert col in header
    row = next(line for line in text.splitlines() if line.startswith("| `short_c8`"))
    assert "| 128 | 16 | 8 | 40 | 2 (0) |" in row
    assert "Workload: background/control ISL 128, OSL 16, concurrency 8, 40 requests per rep" in text
    assert "![mixed_itl_rep1](plots/mixed_itl_rep1.png)" in text
    assert "numpy linear interpolation" in text


def test_background_finished_before_injection_is_never_a_success(tmp_path: Path, cli) -> None:
    run = make_run(tmp_path, reps=1, bg_overlaps=False)
    shutil.rmtree(run / "cases" / "short_c16")
    code, _, err = cli("summarize", run)
    assert code == 0, err
    bg = next(r for r in _rows(run / "summary.csv") if r["role"] == "decode_background")
    assert bg["status"] == "failed" and bg["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION"
    text = (run / "report.md").read_text()
    assert "No valid A/B pair" in text and "BACKGROUND_FINISHED_BEFORE_INJECTION" in text
    assert _rows(run / "ab.csv") == []


def test_meta_marked_background_failure_and_count_mismatch(tmp_path: Path, cli) -> None:
    from analysis import state

    run = make_run(tmp_path, reps=1)
    state.mark_case_failed(
        run / "mixed" / "rep1" / "decode_background", "BACKGROUND_FINISHED_BEFORE_INJECTION", "x"
    )
    meta = run / "cases" / "short_c8" / "rep1" / "meta.json"
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), num_prompts=41)))
    bench = run / "cases" / "short_c16" / "rep1" / "bench.json"
    bench.write_text(json.dumps(dict(json.loads(bench.read_text()), reliable=False)))
    code, _, err = cli("summarize", run)
    assert code == 0, err
    rows = _rows(run / "summary.csv")
    bg = next(r for r in rows if r["role"] == "decode_background")
    assert bg["status"] == "failed"
    c8 = next(r for r in rows if r["case_id"] == "short_c8")
    assert (
        c8["status"] == "failed"
        and c8["error_type"] == "BENCH_FAILED"
        and "40 completed of 41" in c8["reason"]
    )
    c16 = next(r for r in rows if r["case_id"] == "short_c16")
    assert c16["status"] == "completed" and c16["reliable"] == "False" and "unreliable" in c16["status_note"]
    assert "client timing unreliable" in (run / "report.md").read_text()


def _assert_nothing_written(run: Path) -> None:
    for name in (*OUTPUTS, "ab.csv"):
        assert not (run / name).exists()
    assert not (run / "plots").exists()


def test_case_dir_with_neither_file_is_exit_2_naming_it(tmp_path: Path, cli) -> None:
    run = make_run(tmp_path, reps=1)
    empty = run / "cases" / "ghost" / "rep1"
    empty.mkdir(parents=True)
    code, _, err = cli("summarize", run)
    assert code == 2 and str(empty) in err and "neither meta.json nor bench.json" in err
    _assert_nothing_written(run)


def test_truncated_result_of_a_completed_case_is_listed_and_the_rest_summarised(tmp_path: Path, cli) -> None:
    """Issue 17: one unreadable file no longer aborts the summary (it was exit 2, nothing written)."""
    run = make_run(tmp_path, reps=1)
    bench = run / "cases" / "short_c8" / "rep1" / "bench.json"
    bench.write_bytes(bench.read_bytes()[:3000])
    code, _, err = cli("summarize", run)
    assert code == 3 and str(bench) in err and "truncated" in err
    rows = _rows(run / "summary.csv")
    c8 = next(r for r in rows if r["case_id"] == "short_c8")
    assert c8["status"] == "failed" and c8["error_type"] == "BENCH_FAILED" and "unreadable" in c8["reason"]
    assert next(r for r in rows if r["case_id"] == "short_c16")["status"] == "completed"
    text = (run / "report.md").read_text()
    assert "1 result file(s) could not be read" in text and f"`{bench}`: " in text and "truncated" in text


def test_truncated_result_of_a_failed_case_is_only_noted(tmp_path: Path, cli) -> None:
    from analysis import state

    run = make_run(tmp_path, reps=1)
    d = run / "cases" / "short_c8" / "rep1"
    (d / "bench.json").write_bytes((FIXTURES / "sglang-0.5.23_c32_details.jsonl").read_bytes()[:3000])
    state.mark_case_failed(d, "TIMEOUT", "killed at 600 s")
    code, _, err = cli("summarize", run)
    assert code == 0, err
    row = next(r for r in _rows(run / "summary.csv") if r["case_id"] == "short_c8")
    assert (
        row["status"] == "failed"
        and row["error_type"] == "TIMEOUT"
        and "result unreadable" in row["status_note"]
    )


def test_sequential_and_parallel_reads_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from analysis import summarize as mod

    run = make_run(tmp_path, reps=2)
    mod.summarize(run)  # 11 files: the two-process path
    parallel = (run / "aggregate.csv").read_text()
    monkeypatch.setattr(mod, "PARALLEL_MIN_FILES", 10_000)
    mod.summarize(run)
    assert (run / "aggregate.csv").read_text() == parallel  # also: the bootstrap is seeded


def test_missing_run_dir_and_empty_run(tmp_path: Path, cli) -> None:
    code, _, err = cli("summarize", tmp_path / "nope")
    assert code == 2 and "run directory not found" in err
    run = tmp_path / "stopped"
    run.mkdir()
    (run / "manifest.json").write_text(
        json.dumps({"status": "failed", "abort_reasons": ["NCCL gate: NET/Socket"]})
    )
    code, _, err = cli("summarize", run)
    assert code == 0, err  # a run stopped before its first case still gets a report that says so
    text = (run / "report.md").read_text()
    assert "No case ran" in text and "NCCL gate: NET/Socket" in text
    assert (run / "summary.csv").read_text().startswith("suite,case_id")


def test_background_without_timestamps_gets_no_timeline_and_a_note(tmp_path: Path, cli) -> None:
    run = make_run(tmp_path, reps=1)
    bg = run / "mixed" / "rep1" / "decode_background"
    shutil.copy(FIXTURES / "sglang-0.5.23_c32_details.jsonl", bg / "bench.json")
    meta = json.loads((bg / "meta.json").read_text())
    (bg / "meta.json").write_text(json.dumps(dict(meta, num_prompts=96)))
    code, _, err = cli("summarize", run)
    assert code == 0, err
    assert not (run / "plots" / "mixed_itl_rep1.png").exists()
    row = next(r for r in _rows(run / "summary.csv") if r["role"] == "decode_background")
    assert row["status"] == "completed" and row["per_request_arrays"] == "present"
    assert "no ITL timeline" in row["status_note"] and "overlap not verifiable" in row["status_note"]


def test_bar_charts_drawn_in_a_child_process_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many cases one bar chart is drawn in a forked child: same files, same bytes."""
    from analysis import plots
    from analysis import summarize as mod

    run = make_run(tmp_path, reps=1)
    monkeypatch.setattr(plots, "PARALLEL_MIN_BARS", 10_000)
    mod.summarize(run)
    serial = {p.name: p.read_bytes() for p in (run / "plots").glob("*.png")}
    shutil.rmtree(run / "plots")
    monkeypatch.setattr(plots, "PARALLEL_MIN_BARS", 1)
    mod.summarize(run)
    forked = {p.name: p.read_bytes() for p in (run / "plots").glob("*.png")}
    assert forked.keys() == serial.keys() and "latency_p95.png" in forked
    assert forked["latency_p95.png"] == serial["latency_p95.png"]
    assert forked["throughput.png"] == serial["throughput.png"]


def test_a_plot_failing_in_the_child_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from analysis import plots
    from analysis import summarize as mod

    run = make_run(tmp_path, reps=1)
    monkeypatch.setattr(plots, "PARALLEL_MIN_BARS", 1)

    def broken(path: Path, agg: list) -> bool:
        raise ValueError("boom")

    monkeypatch.setattr(plots, "plot_latency", broken)
    with pytest.raises(RuntimeError, match=r"latency_p95\.png"):
        mod.summarize(run)
    assert not (run / "report.md").exists()


@pytest.mark.parametrize("engine_env", [{"ENGINESIM_TIME_SCALE": "0.02"}, {}], ids=["enginesim", "gpu"])
def test_report_never_lets_an_emulated_run_pass_for_a_gpu_measurement(
    tmp_path: Path, cli, engine_env: dict
) -> None:
    run = tmp_path / "stopped"
    run.mkdir()
    manifest = {
        "status": "failed",
        "engine_flags": "--model-path m --tp-size 16",
        "engine_env": engine_env,
        "nccl_env": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1"},
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli("summarize", run)
    assert code == 0, err
    text = (run / "report.md").read_text()
    assert "- engine flags: `--model-path m --tp-size 16`" in text
    assert "- NCCL env: `NCCL_IB_HCA==mlx5_0:1,mlx5_3:1`" in text
    assert ("emulated engine (enginesim), time scale 0.02" in text) == bool(engine_env)
