"""loadgen end to end: real processes, real HTTP, against the in-test fake server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from fakeserver import FakeServer
from lg_helpers import ROOT

BASE = ["--random-input-len", "16", "--random-output-len", "8", "--random-range-ratio", "1"]


@pytest.mark.parametrize(
    "backend,path",
    [
        ("sglang", "/generate"),
        ("sglang-oai", "/v1/completions"),
        ("vllm", "/v1/completions"),
        ("sglang-oai-chat", "/v1/chat/completions"),
        ("vllm-chat", "/v1/chat/completions"),
    ],
)
def test_each_backend_measures_every_request(lg, backend, path):
    with FakeServer(ttft=0.03, itl=0.004) as srv:
        cp, res = lg(
            [
                "--backend",
                backend,
                "--base-url",
                srv.url,
                "--num-prompts",
                "12",
                "--max-concurrency",
                "4",
                *BASE,
                "--output-details",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert res["schema"] == "quickmap.loadgen/1" and res["complete"] is True
    assert res["completed"] == 12 and res["failed"] == 0
    assert res["total_output_tokens"] == 12 * 8
    assert res["total_input_tokens"] == 12 * 16
    assert all(r["tokens_source"] == "server" for r in res["requests"])
    # the server is never early: TTFT >= 30 ms, E2E >= 30 + 7 x 4 ms (upper bounds are loose: the
    # test box is shared, a late server is not the client's error)
    assert all(r["ttft_ms"] >= 29.9 and r["e2e_ms"] >= 57.9 for r in res["requests"])
    assert res["median_ttft_ms"] < 1000
    # one token per event: the mean per-event ITL equals the mean TPOT of equal-length requests
    assert abs(res["mean_itl_ms"] - res["mean_tpot_ms"]) < 1e-6
    main = [r for r in srv.requests if r["path"] == path]
    assert len(main) == 13  # 12 + 1 warm-up
    body = main[-1]["body"]
    if backend == "sglang":
        assert len(body["input_ids"]) == 16 and body["sampling_params"]["ignore_eos"] is True
    elif path == "/v1/completions":
        assert isinstance(body["prompt"], list) and len(body["prompt"]) == 16
        assert body["model"] == "fake-model" and body["ignore_eos"] is True
    else:
        assert isinstance(body["messages"][0]["content"], str)
        assert body["max_completion_tokens"] == 8
    r0 = res["requests"][0]
    assert len(r0["event_times_s"]) == 8 and r0["event_tokens"] == [1] * 8
    assert len(res["ttfts"]) == 12 and len(res["itls"][0]) == 7
    assert "Starting main benchmark run..." in cp.stdout.splitlines()


@pytest.mark.parametrize("ts", ["kernel", "read"])
def test_both_timestamp_sources_agree_with_the_server_schedule(lg, ts):
    # kernel receive timestamps (SO_TIMESTAMPNS) and loop read times measure the same schedule
    with FakeServer(ttft=0.02, itl=0.01) as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "6",
                "--max-concurrency",
                "3",
                "--random-input-len",
                "8",
                "--random-output-len",
                "6",
                "--random-range-ratio",
                "1",
                "--timestamps",
                ts,
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert res["timestamps"] == ts and res["completed"] == 6
    assert all(r["ttft_ms"] >= 19.9 and r["e2e_ms"] >= 69.9 for r in res["requests"])
    assert res["median_ttft_ms"] < 1000 and res["p99_e2e_latency_ms"] < 2000


def test_disable_ignore_eos_is_sent(lg):
    with FakeServer() as srv:
        cp, _res = lg(
            [
                "--backend",
                "sglang-oai",
                "--base-url",
                srv.url,
                "--num-prompts",
                "2",
                *BASE,
                "--disable-ignore-eos",
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert all(r["body"]["ignore_eos"] is False for r in srv.requests)


def test_itl_split_for_multi_token_events(lg):
    # 4 tokens per SSE event, 20 ms between events: per-event ITL 20 ms, per-token 5 ms
    with FakeServer(ttft=0.01, itl=0.02, tokens_per_event=4) as srv:
        cp, res = lg(
            [
                "--backend",
                "vllm",
                "--base-url",
                srv.url,
                "--num-prompts",
                "4",
                "--max-concurrency",
                "4",
                "--random-input-len",
                "8",
                "--random-output-len",
                "16",
                "--random-range-ratio",
                "1",
                "--output-details",
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert res["total_output_tokens"] == 64
    assert all(r["e2e_ms"] - r["ttft_ms"] >= 0 for r in res["requests"])
    assert all(r["e2e_ms"] >= 69.9 for r in res["requests"])  # 10 ms + 3 x 20 ms at the earliest
    # every event carries 4 tokens: each per-token sample is a quarter of its event gap
    assert abs(res["median_itl_per_token_ms"] - res["median_itl_ms"] / 4) < 1e-6
    r = res["requests"][0]
    assert r["event_tokens"] == [4, 4, 4, 4]
    assert len(res["itls"][0]) == 12  # 3 gaps x 4 tokens, split evenly
    assert abs(res["itls"][0][0] - res["itls"][0][3]) < 1e-12
    # TPOT = (E2E - TTFT)/(16 - 1), the per-token ITLs of a request sum to E2E - TTFT
    r = res["requests"][0]
    assert abs(r["tpot_ms"] - (r["e2e_ms"] - r["ttft_ms"]) / 15) < 1e-6
    assert abs(sum(res["itls"][0]) * 1e3 - (r["e2e_ms"] - r["ttft_ms"])) < 1e-3


def test_queue_time_is_reported_not_hidden(lg):
    # cap 1, 4 requests at once, each ~60 ms: the k-th waits ~k*60 ms for the slot; TTFT stays ~40 ms
    with FakeServer(ttft=0.04, itl=0.005) as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "4",
                "--max-concurrency",
                "1",
                "--random-input-len",
                "8",
                "--random-output-len",
                "5",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    reqs = sorted(res["requests"], key=lambda r: r["index"])
    q = [r["queue_time_ms"] for r in reqs]
    assert q[0] < 5.0
    for k in (1, 2, 3):
        # each request takes >= 60 ms at the server; the k-th waits for all before it
        assert 55.0 * k < q[k] < 55.0 * k + 1000.0, q
        # the wait is the gap from the schedule to the send, minus only the (tiny) schedule lag
        gap_ms = (reqs[k]["send_s"] - reqs[k]["scheduled_s"]) * 1e3
        assert abs(gap_ms - q[k] - reqs[k]["schedule_lag_ms"]) < 1e-3
        assert reqs[k]["schedule_lag_ms"] < 50.0
    assert all(39.9 <= r["ttft_ms"] < 1000.0 for r in reqs)
    assert res["mean_queue_time_ms"] > 50.0
    assert srv.max_active == 1


def test_achieved_rate_within_2pct_over_2000_requests(lg):
    with FakeServer(ttft=0.0, itl=0.0) as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "2000",
                "--request-rate",
                "800",
                "--random-input-len",
                "4",
                "--random-output-len",
                "1",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
                "--seed",
                "3",
            ],
            timeout=90,
        )
        arrivals = sorted(r["t"] for r in srv.requests)
    assert cp.returncode == 0, cp.stderr
    assert res["completed"] == 2000
    assert abs(res["achieved_request_rate"] - 800) / 800 < 0.02
    # The server's clock must see the same pacing: over the middle 80% of the run the arrivals span
    # the scheduled span (no drift). The ends are left out because a loaded box can delay the very
    # first send (reported as schedule lag), which says nothing about the rate.
    scheduled = sorted(r["scheduled_s"] for r in res["requests"])
    lo, hi = len(arrivals) // 10, len(arrivals) * 9 // 10
    pace = (arrivals[hi] - arrivals[lo]) / (scheduled[hi] - scheduled[lo])
    assert abs(pace - 1) < 0.02, pace


@pytest.mark.parametrize(
    "mode,cls,extra",
    [
        ("http500", "http_status", []),
        ("cut", "stream_cut", []),
        ("malformed", "server_error", []),
        ("error_event", "server_error", []),
        ("no_first_token", "timeout", ["--request-timeout", "1.5"]),
    ],
)
def test_error_classes_and_the_run_carries_on(lg, mode, cls, extra):
    with FakeServer(mode=mode, fail_every=2, ttft=0.01, itl=0.002) as srv:
        t = time.monotonic()
        cp, res = lg(
            [
                "--backend",
                "sglang-oai",
                "--base-url",
                srv.url,
                "--num-prompts",
                "6",
                "--max-concurrency",
                "3",
                *BASE,
                "--warmup-requests",
                "0",
                *extra,
            ],
            timeout=60,
        )
        took = time.monotonic() - t
    # the run carries on and writes every record, but fails its own bar: 3 of 6 failed > 0 allowed
    assert cp.returncode == 3, cp.stderr
    assert "3 of 6 requests failed" in cp.stderr and "--max-failed-fraction 0" in cp.stderr
    assert res["failed"] == 3 and res["completed"] == 3
    assert res["errors_by_class"] == {cls: 3}
    assert res["reliable"] is False
    assert any(r.startswith(f"3 of 6 requests failed ({cls} 3)") for r in res["reliability"]["reasons"])
    bad = [r for r in res["requests"] if not r["success"]]
    assert all(r["error_class"] == cls and r["error"] for r in bad)
    if cls == "http_status":
        assert all(r["http_status"] == 500 and "boom" in r["error"] for r in bad)
    if cls == "timeout":
        assert took < 15.0  # nothing hangs past --request-timeout


def test_max_failed_fraction_sets_the_bar(lg):
    # half of the requests fail: allowed with --max-failed-fraction 0.5 (exit 0), not with 0.4 (exit 3);
    # either way the timing of a run with failures is not called reliable
    codes = {}
    for frac in ("0.5", "0.4"):
        with FakeServer(mode="http500", fail_every=2) as srv:
            cp, res = lg(
                ["--backend", "sglang", "--base-url", srv.url, "--num-prompts", "6", "--max-concurrency", "3",
                 *BASE, "--warmup-requests", "0", "--max-failed-fraction", frac]
            )  # fmt: skip
        codes[frac] = cp.returncode
        assert res["failed"] == 3 and res["max_failed_fraction"] == float(frac)
        assert res["reliable"] is False
    assert codes == {"0.5": 0, "0.4": 3}


def test_server_closing_without_answer_is_a_connection_error(lg):
    # every request is answered by a close: the one resend on a fresh connection fails too
    with FakeServer(mode="close_early") as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "4",
                "--max-concurrency",
                "2",
                *BASE,
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 3, cp.stderr
    assert res["failed"] == 4 and res["errors_by_class"] == {"connection": 4}


def test_stale_keepalive_connection_is_resent_once(lg):
    # the server drops every reused connection unanswered: each request is resent once on a new
    # connection and succeeds; nothing is counted as failed
    with FakeServer(mode="drop_reused") as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "6",
                "--max-concurrency",
                "2",
                *BASE,
                "--warmup-requests",
                "0",
            ]
        )
        dropped = srv.dropped
    assert cp.returncode == 0, cp.stderr
    assert res["completed"] == 6 and res["failed"] == 0
    assert dropped >= 4  # the pre-opened connections serve one request each, then every reuse is dropped


def test_unreachable_server_fails_requests_with_connection_class(lg):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cp, res = lg(
        [
            "--backend",
            "sglang",
            "--port",
            str(port),
            "--num-prompts",
            "3",
            *BASE,
            "--warmup-requests",
            "0",
            "--request-timeout",
            "5",
        ]
    )
    # every request failed: exit 3 and reliable false (it used to be exit 0 and reliable true)
    assert cp.returncode == 3, cp.stderr
    assert res["failed"] == 3 and res["errors_by_class"] == {"connection": 3}
    assert res["reliable"] is False and res["complete"] is True


def test_flush_retried_while_busy(lg):
    with FakeServer(flush_busy=3) as srv:
        cp, res = lg(
            ["--backend", "sglang", "--base-url", srv.url, "--num-prompts", "2", *BASE, "--flush-cache"]
        )
        calls = srv.flush_calls
    assert cp.returncode == 0, cp.stderr
    assert calls == 4 and res["completed"] == 2


def test_run_refused_when_flush_never_succeeds(lg):
    with FakeServer(flush_busy=10**6) as srv:
        cp, res = lg(
            [
                "--backend",
                "vllm",
                "--base-url",
                srv.url,
                "--num-prompts",
                "2",
                *BASE,
                "--flush-cache",
                "--flush-timeout",
                "1.2",
                "--warmup-requests",
                "0",
            ]
        )
        main = [r for r in srv.requests]
    assert cp.returncode == 3
    assert "--flush-cache" in cp.stderr and "/reset_prefix_cache" in cp.stderr
    assert res is None and main == []


def test_metric_deltas(lg):
    with FakeServer() as srv:
        cp, res = lg(
            ["--backend", "sglang", "--base-url", srv.url, "--num-prompts", "5", *BASE, "--scrape-metrics"]
        )
    assert cp.returncode == 0, cp.stderr
    sm = res["server_metrics"]
    # the warm-up request ran before the "before" scrape: only the 5 main requests are in the delta
    assert sm["delta"]["sglang:num_requests_total"] == 5
    assert sm["delta"]["sglang:generation_tokens_total"] == 40
    assert sm["before"]["sglang:num_requests_total"] == 1


def test_phase_file_and_marker(lg, tmp_path):
    pf = tmp_path / "phase.json"
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "2",
                *BASE,
                "--phase-file",
                str(pf),
            ]
        )
    assert cp.returncode == 0, cp.stderr
    ph = json.loads(pf.read_text())
    assert ph["phase"] == "done" and abs(ph["time"] - time.time()) < 60
    lines = cp.stdout.splitlines()
    assert lines.index("Starting main benchmark run...") > lines.index("Starting warmup with 1 sequences...")
    assert res["main_start_s"] > 0 and res["main_end_s"] > res["main_start_s"]


def test_ctrl_c_writes_incomplete_result(tmp_path):
    out = tmp_path / "r.json"
    with FakeServer(ttft=0.01, itl=0.05) as srv:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadgen",
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "40",
                "--max-concurrency",
                "4",
                "--random-input-len",
                "8",
                "--random-output-len",
                "40",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
                "--output-file",
                str(out),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        for line in p.stdout:
            if line.strip() == "Starting main benchmark run..." or time.monotonic() > deadline:
                break
        time.sleep(2.5)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
    assert p.returncode == 130
    res = json.loads(out.read_text())
    assert res["complete"] is False and res["reliable"] is False
    assert 4 <= res["completed"] < 40
    assert res["errors_by_class"].get("cancelled", 0) >= 1


def test_strict_exits_1_when_unreliable(lg):
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "4",
                *BASE,
                "--strict",
                "--max-lag-ms",
                "0",
            ]
        )
    assert cp.returncode == 1
    assert res["reliable"] is False and res["reliability"]["reasons"]
    assert "unreliable" in cp.stderr


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--random-range-ratio", "1.5"], "--random-range-ratio"),
        (["--range-ratio-semantics", "vllm", "--random-range-ratio", "1"], "--random-range-ratio"),
        (["--request-rate", "-3"], "--request-rate"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--backend", "tgi"], "--backend"),
        (["--dataset-name", "jsonl"], "--dataset-path"),
        (["--burstiness", "0.5", "--arrival", "poisson"], "--burstiness"),
        (["--workers", "zero"], "--workers"),
        (["--base-url", "ftp://x"], "--base-url"),
        (["--max-failed-fraction", "1.5"], "--max-failed-fraction"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(lg, args, flag):
    cp, res = lg(["--num-prompts", "1", *args], out=False)
    assert cp.returncode == 2
    assert flag in cp.stderr
    assert res is None


def test_multiple_workers_hold_the_concurrency(lg):
    with FakeServer(ttft=0.05, itl=0.01) as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "40",
                "--max-concurrency",
                "20",
                "--random-input-len",
                "8",
                "--random-output-len",
                "10",
                "--random-range-ratio",
                "1",
                "--workers",
                "2",
                "--warmup-requests",
                "2",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert res["workers"] == 2 and res["completed"] == 40
    assert srv.max_active == 20
    assert res["max_concurrent_requests"] == 20
    assert sorted(r["index"] for r in res["requests"]) == list(range(40))


def test_zipapp_runs_with_stdlib_only(tmp_path):
    pyz = tmp_path / "loadgen.pyz"
    subprocess.run([sys.executable, "-m", "loadgen.build_zipapp", str(pyz)], cwd=ROOT, check=True, timeout=60)
    # a bare interpreter: -I ignores the venv's site-packages (no uvloop/orjson/tokenizers)
    bare = os.environ.get("LOADGEN_BARE_PYTHON", sys.executable)
    out = tmp_path / "z.json"
    with FakeServer() as srv:
        cp = subprocess.run(
            [
                bare,
                "-I",
                "-S",
                str(pyz),
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                srv.url,
                "--num-prompts",
                "3",
                *BASE,
                "--output-file",
                str(out),
            ],
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert cp.returncode == 0, cp.stderr
    res = json.loads(out.read_text())
    assert res["completed"] == 3 and res["total_output_tokens"] == 24


def test_progress_bar_only_on_a_terminal(lg, tmp_path):
    import pty

    args = [
        "--backend",
        "sglang",
        "--num-prompts",
        "6",
        "--max-concurrency",
        "2",
        "--random-input-len",
        "8",
        "--random-output-len",
        "30",
        "--random-range-ratio",
        "1",
        "--warmup-requests",
        "0",
    ]
    with FakeServer(ttft=0.01, itl=0.03) as srv:
        cp, _ = lg([*args, "--base-url", srv.url])
        assert cp.returncode == 0 and "[#" not in cp.stderr and "6/6" not in cp.stderr
        master, slave = pty.openpty()
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadgen",
                *args,
                "--base-url",
                srv.url,
                "--output-file",
                str(tmp_path / "t.json"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        p.wait(timeout=30)
        os.close(master)
    assert p.returncode == 0
    assert b"\r[" in seen and b"6/6" in seen
