"""bench_result: a case is good only when its result file says so (parses, count, OSL), whatever the client.

Uses the real SGLang client outputs kept in tests/analysis/fixtures/ (what wrote them and how: that
folder's README) and loadgen/vLLM objects built to the key sets of loadgen's result schema
(analysis/README.md) and of vLLM's ``bench serve`` result file (docs/bench-clients.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[1] / "analysis" / "fixtures"
SGLANG_DETAILS = PEERS / "sglang-0.5.23_c32_details.jsonl"  # 96 prompts, OSL 64, --output-details
SGLANG_SUMMARY = PEERS / "sglang-0.5.23_c64_summary.jsonl"  # 256 prompts, OSL 128, no details
SGLANG_LOG = PEERS / "sglang-0.5.23_c32_client.log"


def loadgen_result(n: int = 64, osl: int = 128, outputs: list[int] | None = None, failed: int = 0) -> dict:
    """A quickmap.loadgen/1 object: n requests, the first ``failed`` of them failed with a timeout."""
    outputs = outputs or [osl] * n
    requests = []
    for i in range(n):
        ok = i >= failed
        requests.append(
            {
                "index": i,
                "scheduled_s": 0.01 * i,
                "send_s": 0.01 * i,
                "queue_time_ms": 0.1,
                "schedule_lag_ms": 0.05,
                "ttft_ms": 40.0 if ok else None,
                "e2e_ms": 900.0 if ok else None,
                "tpot_ms": 7.0 if ok else None,
                "input_tokens": 1024,
                "output_tokens": outputs[i] if ok else 0,
                "tokens_source": "server",
                "success": ok,
                "error_class": None if ok else "timeout",
                "error": None if ok else "request timed out after 30 s",
                "http_status": 200 if ok else None,
            }
        )
    return {
        "schema": "quickmap.loadgen/1",
        "tool": {"name": "loadgen", "version": "0.1.0"},
        "complete": True,
        "reliable": True,
        "backend": "sglang",
        "num_prompts": n,
        "random_output_len": osl,
        "duration": 3.2,
        "completed": n - failed,
        "failed": failed,
        "total_output_tokens": sum(r["output_tokens"] for r in requests),
        "errors_by_class": {"timeout": failed} if failed else {},
        "requests": requests,
    }


def vllm_result(completed: int = 32, failed: int = 0, total_output: int = 32 * 256) -> dict:
    return {
        "date": "20261202-141500",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "Qwen/Qwen3-0.6B",
        "tokenizer_id": "Qwen/Qwen3-0.6B",
        "num_prompts": completed + failed,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 8,
        "duration": 12.5,
        "completed": completed,
        "failed": failed,
        "total_input_tokens": 32 * 1024,
        "total_output_tokens": total_output,
        "request_throughput": 2.56,
        "request_goodput": None,
        "output_throughput": 655.4,
        "total_token_throughput": 3276.8,
        "latencies": [3.1] * completed,
        "mean_ttft_ms": 41.0,
        "p99_ttft_ms": 60.0,
    }


def dump(tmp_path: Path, name: str, obj: object, indent: int | None = 2) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(obj, indent=indent))
    return str(path)


def test_loadgen_result_passes_with_stats(run, tmp_path):
    path = dump(tmp_path, "bench.json", loadgen_result(64, 128))
    kind, res = run("bench_result", {"path": path, "expect_requests": 64, "expect_output_len": 128})
    assert kind == "exit", res["msg"]
    assert res["passed"] is True and res["changed"] is False
    assert (res["format"], res["layout"], res["completed"], res["failed"]) == ("loadgen", "json", 64, 0)
    assert res["output_tokens"] == {"count": 64, "min": 128, "max": 128, "mean": 128.0, "total": 8192}
    assert res["output_check"] == "per_request" and res["reason"] is None


def test_completed_short_of_expected_fails_with_counts(run, tmp_path):
    path = dump(tmp_path, "bench.json", loadgen_result(64, 128, failed=3))
    kind, res = run("bench_result", {"path": path, "expect_requests": 64, "expect_output_len": 128})
    assert kind == "fail" and res["reason"] == "count"
    assert (
        res["msg"]
        == f'{path}: completed 61 != expected 64 requests, failed 3, errors_by_class {{"timeout": 3}} '
        "(rule: every request of the case must complete)"
    )


def test_outputs_short_of_osl_fail_unless_the_fraction_allows_it(run, tmp_path):
    outputs = [128] * 63 + [100]
    path = dump(tmp_path, "bench.json", loadgen_result(64, 128, outputs=outputs))
    kind, res = run("bench_result", {"path": path, "expect_requests": 64, "expect_output_len": 128})
    assert kind == "fail" and res["reason"] == "short_output" and res["short_outputs"] == 1
    assert "1 of 64 completed requests have fewer than 128 output tokens (min 100" in res["msg"]
    kind, res = run(
        "bench_result",
        {"path": path, "expect_requests": 64, "expect_output_len": 128, "min_output_fraction": 0.9},
    )
    assert kind == "exit" and res["short_outputs"] == 1


def test_interrupted_loadgen_run_is_incomplete(run, tmp_path):
    obj = loadgen_result(64, 128)
    obj["complete"] = False
    path = dump(tmp_path, "bench.json", obj)
    kind, res = run("bench_result", {"path": path, "expect_requests": 64})
    assert kind == "fail" and res["reason"] == "incomplete" and "complete=false" in res["msg"]


def test_missing_empty_and_truncated_files(run, tmp_path):
    missing = str(tmp_path / "nope.json")
    kind, res = run("bench_result", {"path": missing, "expect_requests": 1})
    assert kind == "fail" and res["reason"] == "missing" and res["msg"].startswith(missing + ": missing file")

    empty = tmp_path / "empty.json"
    empty.write_text("")
    kind, res = run("bench_result", {"path": str(empty), "expect_requests": 1})
    assert kind == "fail" and res["reason"] == "empty"

    full = json.dumps(loadgen_result(8, 16), indent=2)
    cut = tmp_path / "cut.json"
    cut.write_text(full[: len(full) // 2])
    kind, res = run("bench_result", {"path": str(cut), "expect_requests": 8})
    assert kind == "fail" and res["reason"] == "truncated" and str(cut) in res["msg"]

    garbage = tmp_path / "garbage.json"
    garbage.write_text("Traceback (most recent call last):\n  boom\n")
    kind, res = run("bench_result", {"path": str(garbage), "expect_requests": 8})
    assert kind == "fail" and res["reason"] == "unparsable"
    assert "no benchmark result JSON object found among 2 lines" in res["msg"]


def test_real_sglang_details_jsonl_per_request_check(run):
    kind, res = run(
        "bench_result", {"path": str(SGLANG_DETAILS), "expect_requests": 96, "expect_output_len": 64}
    )
    assert kind == "exit", res["msg"]
    assert res["format"] == "sglang" and res["completed"] == 96 and res["failed"] == 0
    assert res["output_check"] == "per_request" and res["output_tokens"]["min"] == 64
    kind, res = run(
        "bench_result", {"path": str(SGLANG_DETAILS), "expect_requests": 96, "expect_output_len": 65}
    )
    assert kind == "fail" and res["reason"] == "short_output" and res["short_outputs"] == 96


def test_real_sglang_summary_uses_the_aggregate(run):
    kind, res = run(
        "bench_result", {"path": str(SGLANG_SUMMARY), "expect_requests": 256, "expect_output_len": 128}
    )
    assert kind == "exit", res["msg"]
    assert res["output_check"] == "aggregate" and res["output_tokens"] is None and res["failed"] is None
    kind, res = run(
        "bench_result", {"path": str(SGLANG_SUMMARY), "expect_requests": 256, "expect_output_len": 256}
    )
    assert kind == "fail" and "total_output_tokens 32768 < 65536" in res["msg"]


def test_sglang_appended_runs_pick_last_or_first_and_catch_a_cut_last_run(run, tmp_path):
    first, second = SGLANG_SUMMARY.read_text().strip(), SGLANG_DETAILS.read_text().strip()
    path = tmp_path / "sglang.jsonl"
    path.write_text(first + "\n" + second + "\n")
    kind, res = run("bench_result", {"path": str(path), "expect_requests": 96})
    assert kind == "exit" and res["runs_in_file"] == 2 and res["completed"] == 96 and res["layout"] == "jsonl"
    kind, res = run("bench_result", {"path": str(path), "expect_requests": 256, "record": "first"})
    assert kind == "exit" and res["completed"] == 256
    path.write_text(first + "\n" + second[:5000] + "\n")
    kind, res = run("bench_result", {"path": str(path), "expect_requests": 256})
    assert kind == "fail" and res["reason"] == "truncated" and "last line 2" in res["msg"]


def test_json_line_inside_a_client_log(run, tmp_path):
    log = tmp_path / "bench.log"
    log.write_text(SGLANG_LOG.read_text() + SGLANG_DETAILS.read_text().strip() + "\nbye\n")
    kind, res = run("bench_result", {"path": str(log), "expect_requests": 96, "expect_output_len": 64})
    assert kind == "exit", res["msg"]
    assert res["layout"] == "log" and res["format"] == "sglang"


def test_vllm_result(run, tmp_path):
    path = dump(tmp_path, "vllm.json", vllm_result(32, 0))
    kind, res = run("bench_result", {"path": path, "expect_requests": 32, "expect_output_len": 256})
    assert kind == "exit", res["msg"]
    assert res["format"] == "vllm" and res["num_prompts"] == 32 and res["output_check"] == "aggregate"
    path = dump(tmp_path, "vllm_bad.json", vllm_result(30, 2, total_output=30 * 256))
    kind, res = run("bench_result", {"path": path, "expect_requests": 32})
    assert kind == "fail" and "completed 30 != expected 32 requests, failed 2" in res["msg"]


def test_osl_unverifiable_fails_closed(run, tmp_path):
    obj = vllm_result(32)
    del obj["total_output_tokens"]
    path = dump(tmp_path, "vllm.json", obj)
    kind, res = run("bench_result", {"path": path, "expect_requests": 32, "expect_output_len": 256})
    assert kind == "fail" and "cannot verify output lengths" in res["msg"]


def test_a_json_that_is_not_a_result_is_refused(run, tmp_path):
    path = dump(tmp_path, "meta.json", {"case_id": "c1", "status": "completed"})
    kind, res = run("bench_result", {"path": path, "expect_requests": 1})
    assert kind == "fail" and res["reason"] == "unparsable" and "not a benchmark result" in res["msg"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"expect_requests": 0}, "expect_requests=0 (rule: >= 1)"),
        ({"expect_requests": 4, "min_output_fraction": 0.0}, "min_output_fraction=0.0 (rule: 0 < f <= 1)"),
        ({"expect_requests": 4, "expect_output_len": -1}, "expect_output_len=-1"),
    ],
)
def test_bad_options_are_refused(run, tmp_path, args, needle):
    path = dump(tmp_path, "bench.json", loadgen_result(4, 8))
    kind, res = run("bench_result", {"path": path, **args})
    assert kind == "fail" and needle in res["msg"]


def test_check_mode_validates_the_same(run, tmp_path):
    path = dump(tmp_path, "bench.json", loadgen_result(4, 8, failed=1))
    kind, res = run("bench_result", {"path": path, "expect_requests": 4}, check_mode=True)
    assert kind == "fail" and res["reason"] == "count" and res["changed"] is False
