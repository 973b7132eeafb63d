"""The realtime verdict of one emulated case (module_utils/emulation_verdict.py): one judge, fed with the
two /metrics scrapes around a case, for meta.json (the bench_case action) and summary.csv (analysis)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from es_prom import ZERO, scrape

from analysis import emulation
from module_utils.emulation_verdict import case_verdict

REPO = Path(__file__).resolve().parents[2]


def test_on_schedule_is_ok_with_its_realtime_factor_and_scale() -> None:
    v = case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000, late=5))
    assert v["verdict"] == "ok" and v["reasons"] == []
    assert v["time_scale"] == 10.0 and v["realtime_factor"] == pytest.approx(20.0 / 20.1)
    assert v["steps"] == 1000 and v["late_step_share"] == pytest.approx(0.005)
    # 1.2 % late steps already move an ITL p95: the tail no longer stands
    tail = case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000, late=12))
    assert tail["verdict"] == "degraded" and tail["stands"]["itl_tail"] is False


def test_late_steps_degrade_and_a_slow_emulator_is_saturated() -> None:
    degraded = case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000, late=80))
    assert degraded["verdict"] == "degraded" and "8.0% of steps" in degraded["reasons"][0]
    slow = case_verdict(ZERO, scrape(10.0, 2.0, 25.0, 1000))  # 80 % of the promised speed
    assert slow["verdict"] == "saturated" and slow["realtime_factor"] == pytest.approx(0.8)
    changed = case_verdict(ZERO, scrape(10.0, 2.0, 20.0, 1000, changes=1))
    assert changed["verdict"] == "saturated" and "time scale changed" in changed["reasons"][0]


def test_real_engine_has_no_verdict_and_missing_evidence_is_unknown() -> None:
    real = "# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\n"
    real += "sglang:num_running_reqs 1.0\n"
    assert case_verdict(real, real) is None
    assert case_verdict(None, None) is None
    v = case_verdict(None, scrape(10.0, 2.0, 20.0, 1000))
    assert v["verdict"] == "unknown" and "metrics_before.prom" in v["reasons"][0]
    assert case_verdict(ZERO, ZERO)["verdict"] == "unknown"  # no step ran


def _action_plugin():
    spec = importlib.util.spec_from_file_location(
        "qm_bench_case_action", REPO / "action_plugins/bench_case.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_meta_json_and_summary_get_the_same_verdict(tmp_path: Path) -> None:
    (tmp_path / "metrics_before.prom").write_text(ZERO)
    (tmp_path / "metrics_after.prom").write_text(scrape(7.5, 2.0, 15.6, 1000, late=70))
    (tmp_path / "pace.json").write_text(json.dumps({"applied": True, "set_by": "itl", "time_scale": 7.5}))
    meta = _action_plugin()._emulation(tmp_path)
    row: dict = {}
    emulation.attach(row, tmp_path)
    assert meta["verdict"] == row["emulation_verdict"] == "degraded"
    assert meta["realtime_factor"] == row["realtime_factor"] and row["time_scale"] == 7.5
    assert row["scale_set_by"] == "itl"
    json.dumps(meta, allow_nan=False)  # meta.json takes it as is


def test_combine_worst_part_wins_and_a_figure_stands_only_where_every_part_says_so() -> None:
    from module_utils.emulation_verdict import combine

    ok = case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000, late=5))
    tail = case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000, late=80))  # degraded: itl_tail falls
    slow = case_verdict(ZERO, scrape(10.0, 2.0, 25.0, 1000))  # saturated
    unknown = case_verdict(ZERO, ZERO)  # no step ran
    assert combine([ok, ok])["verdict"] == "ok" and combine([ok, ok])["stands"]["itl_tail"] is True
    both = combine([ok, tail])
    assert both["verdict"] == "degraded" and both["stands"] == {
        "tpot": True,
        "throughput": True,
        "ttft": True,
        "itl_tail": False,
    }
    assert combine([ok, tail, unknown])["verdict"] == "unknown"
    worst = combine([unknown, tail, slow, ok])
    assert worst["verdict"] == "saturated" and not any(worst["stands"].values())
    assert worst["realtime_factor"] == pytest.approx(0.8) and worst["parts"] == 4
    assert combine([None, None]) is None and combine([None, ok])["verdict"] == "ok"


def test_filtered_parse_keeps_only_the_families_the_verdict_reads() -> None:
    from module_utils.emulation_verdict import own_lines, parse

    text = scrape(10.0, 2.0, 20.1, 1000, late=5)
    text += "# HELP enginesim:step_lag_seconds x\n# TYPE enginesim:step_lag_seconds histogram\n"
    text += 'enginesim:step_lag_seconds_bucket{le="+Inf"} 3.0\n'
    kept = own_lines(text)
    assert "sglang:" not in kept and "step_lag_seconds" not in kept
    assert "enginesim:steps_total 1000.0" in kept and 'enginesim:step_lag_steps_bucket{le="0.1"}' in kept
    got = parse(text)
    assert got["enginesim:steps_total"] == 1000 and got[("enginesim:step_lag_steps_bucket", 0.1)] == 995
    assert not any("step_lag_seconds" in str(k) for k in got)


def test_a_broken_line_outside_the_enginesim_families_does_not_make_the_verdict_unparsable() -> None:
    """Behaviour change (issue 13): the whole page was parsed, so any broken line raised ValueError."""
    broken = 'sglang:e2e_request_latency_seconds_bucket{le="1.0" 3 oops\n'
    v = case_verdict(ZERO + broken, scrape(10.0, 2.0, 20.1, 1000, late=5) + broken)
    assert v["verdict"] == "ok"
    # a broken line in a family the verdict reads is still refused, never guessed around
    with pytest.raises(ValueError):
        case_verdict(ZERO, scrape(10.0, 2.0, 20.1, 1000) + "enginesim:steps_total 12 oops\n")
