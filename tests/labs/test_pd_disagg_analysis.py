"""analysis/evidence/kv_transfer.py and analysis/labs/pd_disagg.py: KV transfers read from both sides'
/metrics under the engines' own names (SGLang's PD family, enginesim's counters as a real P/D run
scraped them), failures from the connector's log lines, and the per-workload verdict / break-even."""

from __future__ import annotations

from pathlib import Path

from analysis.evidence import kv_transfer, prom
from analysis.labs import pd_disagg

FIX = Path(__file__).parent / "fixtures" / "pd"
LAB = 'engine_type="{role}",model_name="/path/models/deepseek-ai__DeepSeek-R1",pp_rank="0",tp_rank="0"'


def _sglang(
    role: str, failed: float, boot: float, latency: float, mb: float, transfer_q: float
) -> prom.Scrape:
    """An SGLang PD exposition: the family names of SGLang's scheduler metrics (engine-surfaces table)."""
    lab = LAB.format(role=role)
    return prom.parse(
        f"""# HELP sglang:num_transfer_failed_reqs_total Number of transfer failed requests.
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{{{lab}}} {failed}
# HELP sglang:num_bootstrap_failed_reqs_total Number of bootstrap failed requests.
# TYPE sglang:num_bootstrap_failed_reqs_total counter
sglang:num_bootstrap_failed_reqs_total{{{lab}}} {boot}
# HELP sglang:kv_transfer_latency_ms The transfer latency of the KV cache (ms).
# TYPE sglang:kv_transfer_latency_ms gauge
sglang:kv_transfer_latency_ms{{{lab}}} {latency}
# HELP sglang:kv_transfer_total_mb The total size of the transferred KV cache (MB).
# TYPE sglang:kv_transfer_total_mb gauge
sglang:kv_transfer_total_mb{{{lab}}} {mb}
# HELP sglang:num_decode_transfer_queue_reqs The number of requests in the decode transfer queue.
# TYPE sglang:num_decode_transfer_queue_reqs gauge
sglang:num_decode_transfer_queue_reqs{{{lab}}} {transfer_q}
"""
    )


def test_sglang_names_give_failures_as_deltas_and_the_last_transfer_as_gauges() -> None:
    before, after = _sglang("decode", 2, 0, 10.0, 1.0, 0), _sglang("decode", 5, 1, 42.5, 12.25, 3)
    s = kv_transfer.side(before, after)
    assert (s["failures"], s["bootstrap_failures"]) == (3.0, 1.0)
    assert (s["last_latency_ms"], s["last_mb"]) == (42.5, 12.25)
    assert s["transfers"] is None and s["bytes"] is None  # SGLang has no success counter: unknown, not 0
    assert s["sources"]["failures"] == "sglang:num_transfer_failed_reqs_total"
    assert s["queues"] == {"sglang:num_decode_transfer_queue_reqs": 3.0}


def test_enginesim_scrapes_of_a_real_pd_run_give_transfers_bytes_and_time_per_transfer() -> None:
    sides = {
        s: kv_transfer.side(
            prom.read(FIX / f"metrics_{s}_before.prom"), prom.read(FIX / f"metrics_{s}_after.prom")
        )
        for s in ("prefill", "decode")
    }
    kv = kv_transfer.summarise(sides["prefill"], sides["decode"], requests=6)
    assert kv["transfers"] == 6 and kv["failures"] == 0 and kv["bootstrap_failures"] == 0
    assert kv["bytes"] > 0 and kv["mb_per_transfer"] == round(kv["bytes"] / 6 / 1e6, 3)
    assert kv["ms_per_transfer"] > 0
    assert sides["decode"]["sources"]["transfers"] == "enginesim:kv_transfers_total"


def test_connector_log_failures_are_counted_from_sglangs_own_lines() -> None:
    log = "\n".join(
        [
            "Prefill bootstrap failed for request rank=2 req.rid='d3fd' req.bootstrap_room=59 with exception "
            "KVTransferError(bootstrap_room=59): Request 59 timed out after 300.0s in KVPoll.Bootstrapping",
            "[2025-09-17 16:23:13 TP1] Decode transfer failed for request rank=1 decode_req.req.rid='3ce8' "
            "decode_req.req.bootstrap_room=16 with exception KVTransferError(bootstrap_room=16): "
            "Failed due to an unknown reason from another rank",
            "[2025-09-17 16:23:14 TP0] Decode batch. #running-req: 1, #token: 10",
        ]
    )
    assert kv_transfer.log_failures(log) == 2


def _row(wl: str, base: tuple, pd: tuple, transfers: int = 8) -> dict:
    b = dict(zip(("ttft_p50_ms", "tpot_p50_ms", "output_tok_s"), base, strict=True)) | {"n": 8}
    p = dict(zip(("ttft_p50_ms", "tpot_p50_ms", "output_tok_s"), pd, strict=True)) | {"n": 8}
    ratio = {k: pd_disagg.ratio(p[k], b[k]) for k in ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")}
    kv = {"transfers": transfers, "failures": 0, "mb_per_transfer": 1.0, "ms_per_transfer": 2.0}
    return {"baseline": b, "pd": p, "ratio": ratio, "kv": kv, "workload": {"isl": 64, "osl": 8}}


def _fig(rows: dict, through_router: bool = True) -> dict:
    return {
        "workloads": rows,
        "break_even": pd_disagg.break_even(rows),
        "launch": {"through_router": through_router, "measured_url": "http://127.0.0.1:30300"},
    }


COMP = [{"baseline": "baseline", "treatment": "pd", "variable": "P/D"}]
TH = {"margin": 0.1}


def test_break_even_names_where_pd_wins_and_the_verdict_rests_on_tpot() -> None:
    rows = {
        "short_in_long_out": _row("short_in_long_out", (10, 5.0, 100), (14, 3.0, 150)),
        "long_in_short_out": _row("long_in_short_out", (50, 5.0, 100), (90, 5.2, 80)),
    }
    fig = _fig(rows)
    assert fig["break_even"]["tpot_p50_ms"] == {
        "pd": ["short_in_long_out"],
        "baseline": ["long_in_short_out"],
    }
    assert fig["break_even"]["ttft_p50_ms"]["pd"] == []
    v = pd_disagg.judge(fig, COMP, {}, TH)
    assert v.verdict == "supported" and "short_in_long_out" in v.reason
    assert [c["verdict"] for c in v.comparisons] == ["supported", "not supported"]
    assert any("break-even" in o for o in v.observations)


def test_no_tpot_win_is_not_supported() -> None:
    rows = {"long_in_short_out": _row("long_in_short_out", (50, 5.0, 100), (90, 4.8, 80))}
    assert pd_disagg.judge(_fig(rows), COMP, {}, TH).verdict == "not supported"


def test_a_result_not_measured_through_the_router_or_without_transfers_is_inconclusive() -> None:
    rows = {"short_in_long_out": _row("short_in_long_out", (10, 5.0, 100), (14, 3.0, 150))}
    v = pd_disagg.judge(_fig(rows, through_router=False), COMP, {}, TH)
    assert v.verdict == "inconclusive" and "not a P/D result" in v.reason
    rows = {"short_in_long_out": _row("short_in_long_out", (10, 5.0, 100), (14, 3.0, 150), transfers=3)}
    v = pd_disagg.judge(_fig(rows), COMP, {}, TH)
    assert v.verdict == "inconclusive" and "3 KV transfers for 8 requests" in v.reason
