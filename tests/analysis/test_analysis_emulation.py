"""An emulated run's report: figures de-scaled by the time scale each case ran at (its /metrics
evidence, never the configured one), a verdict in every table, and degraded or saturated repetitions
flagged and never pooled with good ones."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from analysis.summarize import summarize
from tests.enginesim.es_prom import ZERO, scrape

FIXTURE = Path(__file__).resolve().parents[1] / "analysis" / "fixtures"


def _loadgen_result(ttft_ms: float, tpot_ms: float, tok_s: float) -> dict:
    """A minimal loadgen result: 8 requests of 16 tokens, every statistic the reader needs."""
    reqs = [
        {"index": i, "scheduled_s": 0.0, "send_s": 0.01 * i, "ttft_ms": ttft_ms,
         "e2e_ms": ttft_ms + 15 * tpot_ms, "tpot_ms": tpot_ms, "input_tokens": 128, "output_tokens": 16,
         "tokens_source": "server",
         "success": True, "error_class": None, "queue_time_ms": 0.0, "schedule_lag_ms": 0.0}
        for i in range(8)
    ]  # fmt: skip
    doc = {
        "schema": "quickmap.loadgen/1", "tool": {"name": "loadgen", "version": "t"}, "complete": True,
        "reliable": True, "backend": "sglang", "random_input_len": 128, "random_output_len": 16,
        "num_prompts": 8, "max_concurrency": 8, "t0_epoch_s": 1000.0, "main_start_s": 0.0,
        "main_end_s": 1.0, "duration": 1.0, "completed": 8, "failed": 0, "total_input_tokens": 1024,
        "total_output_tokens": 128, "request_throughput": 8.0, "input_throughput": 1024.0,
        "output_throughput": tok_s, "total_throughput": tok_s + 1024.0, "requests": reqs,
    }  # fmt: skip
    for m, v in (
        ("ttft", ttft_ms),
        ("tpot", tpot_ms),
        ("itl", tpot_ms),
        ("e2e_latency", ttft_ms + 15 * tpot_ms),
    ):
        for s in ("mean", "median", "std", "p90", "p95", "p99"):
            doc[f"{s}_{m}_ms"] = 0.0 if s == "std" else v
    doc["max_itl_ms"] = doc["mean_itl_per_token_ms"] = doc["median_itl_per_token_ms"] = tpot_ms
    doc["p99_itl_per_token_ms"] = tpot_ms
    return doc


def _case(run: Path, rep: int, scale: float, after: str, wall_ttft: float) -> None:
    d = run / "cases" / "c8" / f"rep{rep}"
    d.mkdir(parents=True)
    (d / "bench.json").write_text(json.dumps(_loadgen_result(wall_ttft, 2.0 * scale, 1000.0 / scale)))
    meta = {"case_id": "c8", "suite": "fixed", "rep": rep, "stage": "short_decode", "isl": 128, "osl": 16,
            "concurrency": 8, "num_prompts": 8, "warmup": 0, "status": "completed"}  # fmt: skip
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "metrics_before.prom").write_text(ZERO)
    (d / "metrics_after.prom").write_text(after)
    (d / "pace.json").write_text(json.dumps({"applied": True, "time_scale": scale, "set_by": "itl"}))


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "emu"
    run.mkdir()
    manifest = {"run_id": "emu", "engine": "sglang", "engine_env": {"ENGINESIM_TIME_SCALE": "0.02"}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    # two good repetitions at 7.5 and 5.0, one saturated at 7.5 with a wall TTFT 10x too long
    _case(run, 1, 7.5, scrape(7.5, 2.0, 15.0, 1000), wall_ttft=7.5 * 40.0)
    _case(run, 2, 5.0, scrape(5.0, 2.0, 10.0, 1000), wall_ttft=5.0 * 40.0)
    _case(run, 3, 7.5, scrape(7.5, 2.0, 30.0, 1000), wall_ttft=7.5 * 400.0)
    summarize(run)
    return run


def test_report_states_each_case_scale_from_its_evidence_and_descales(tmp_path: Path) -> None:
    run = _run(tmp_path)
    text = (run / "report.md").read_text()
    assert "time scale per case, 5 to 7.5** (from each case's /metrics evidence" in text
    assert "time scale 0.02" not in text  # the configured scale is not what the cases ran at
    with open(run / "summary.csv", newline="") as f:
        rows = {r["rep"]: r for r in csv.DictReader(f)}
    assert float(rows["1"]["ttft_p50_ms"]) == 7.5 * 40.0  # summary.csv keeps the wall-clock figure
    assert rows["1"]["emulation_verdict"] == "ok" and float(rows["2"]["time_scale"]) == 5.0
    assert rows["3"]["emulation_verdict"] == "saturated" and float(rows["3"]["realtime_factor"]) == 0.5
    ok_row = next(line for line in text.splitlines() if line.startswith("| `c8`") and "| ok |" in line)
    assert "| 40.0 [40.0, 40.0] |" in ok_row and "| 5/7.5 |" in ok_row  # de-scaled TTFT p50, both reps


def test_saturated_repetitions_are_flagged_never_pooled(tmp_path: Path) -> None:
    run = _run(tmp_path)
    text = (run / "report.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| `c8`")]
    sat = next(line for line in lines if "**saturated** ⚠" in line and "| 1 (0) |" in line)
    assert "| 400.0 |" in sat  # its own row, its own (wrong) figure, flagged
    assert next(line for line in lines if "| ok |" in line).count("| 2 (0) |") == 1
    with open(run / "aggregate.csv", newline="") as f:
        agg = list(csv.DictReader(f))
    ttft = {a["emulation_verdict"]: float(a["mean"]) for a in agg if a["metric"] == "ttft_p50_ms"}
    assert ttft == {"ok": 40.0, "saturated": 400.0}


def test_a_run_without_evidence_says_its_figures_are_not_descaled(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for p in run.glob("cases/c8/rep*/metrics_*.prom"):
        p.unlink()
    shutil.rmtree(run / "plots")
    summarize(run)
    text = (run / "report.md").read_text()
    assert "time scale 0.02** as configured (ENGINESIM_TIME_SCALE), but no case carries" in text
    assert "not de-scaled" in text


def _mixed_role(run: Path, role: str, after: str, t0: float, n: int) -> None:
    d = run / "mixed" / "rep1" / role
    d.mkdir(parents=True)
    doc = _loadgen_result(40.0, 2.0, 1000.0)
    doc["t0_epoch_s"] = t0
    if n == 1:
        doc["requests"] = doc["requests"][:1]
        doc.update(num_prompts=1, max_concurrency=1, completed=1)
    (d / "bench.json").write_text(json.dumps(doc))
    meta = {"case_id": f"mixed_{role}", "suite": "mixed", "role": role, "rep": 1, "stage": "mixed",
            "isl": 128, "osl": 16, "concurrency": n, "num_prompts": n, "warmup": 0,
            "status": "completed"}  # fmt: skip
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "metrics_before.prom").write_text(ZERO)
    (d / "metrics_after.prom").write_text(after)
    (d / "pace.json").write_text(json.dumps({"applied": True, "time_scale": 1.0, "set_by": "step"}))


def test_the_ab_table_shows_each_side_s_emulation_verdict(tmp_path: Path) -> None:
    run = tmp_path / "emu"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "emu", "engine": "sglang"}))
    _mixed_role(run, "control", scrape(1.0, 2.0, 2.0, 1000), 1000.0, 8)
    _mixed_role(run, "decode_background", scrape(1.0, 2.0, 4.0, 1000), 2000.0, 8)
    _mixed_role(run, "prefill_injection", scrape(1.0, 0.1, 0.1, 1000), 2000.5, 1)
    summarize(run)
    text = (run / "report.md").read_text()
    section = text[text.index("## Mixed A/B") :]
    assert "| emulation verdict (ctrl/bg) |" in section
    rows = [line for line in section.splitlines() if line.startswith("| TPOT |")]
    assert rows and rows[0].endswith("| ok/**saturated** ⚠ |"), rows
