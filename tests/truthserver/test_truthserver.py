"""truthserver: the schedule it promises, the streams it writes, the truth it logs, the processes it owns.

Each test runs the real server (``python -m benchmarks.truthserver``) on a free loopback port and
talks to it over real sockets; receive times are ``perf_counter_ns`` (the server's clock too), so a
logged send time can be checked against the moment the bytes arrived.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from time import perf_counter_ns

import pytest

from benchmarks.truthserver import truth
from benchmarks.truthserver.launch import ROOT, TruthServer
from benchmarks.truthserver.rawreader import run as raw_run
from benchmarks.truthserver.words import WordText, stream_words


def post(port: int, path: str, body: dict) -> tuple[bytes, list[tuple[int, bytes]]]:
    """One request on a fresh connection; (whole response, [(receive time, bytes) per read])."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode()
    reads = []
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head + data)
        buf = b""
        while not buf.endswith(b"0\r\n\r\n") and not (b"Content-Length" in buf and _complete(buf)):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            reads.append((perf_counter_ns(), chunk))
            buf += chunk
    return buf, reads


def _complete(buf: bytes) -> bool:
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def sse_events(buf: bytes) -> list[bytes]:
    """The data payloads of a chunked SSE body, in order (without [DONE])."""
    body = buf.partition(b"\r\n\r\n")[2]
    out, pos = b"", 0
    while True:
        le = body.index(b"\r\n", pos)
        size = int(body[pos:le], 16)
        if size == 0:
            break
        out += body[le + 2 : le + 2 + size]
        pos = le + 2 + size + 2
    events = [e[len(b"data: ") :] for e in out.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    return events[:-1]


def log_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_stream_follows_the_schedule_and_logs_true_send_times(tmp_path):
    log = tmp_path / "truth.jsonl"
    with TruthServer(str(log), ttft_ms=40, itl_ms=15, tokens_per_event=3) as srv:
        t_sent = perf_counter_ns()
        body = {"input_ids": [1] * 7, "sampling_params": {"max_new_tokens": 10}, "stream": True}
        buf, reads = post(srv.port, "/generate", body)
    events = [json.loads(e) for e in sse_events(buf)]
    # 10 tokens, 3 per event: 4 events, the last one with the remaining token
    assert [e["meta_info"]["completion_tokens"] for e in events] == [3, 6, 9, 10]
    assert [len(e["text"].split()) for e in events] == [3, 6, 9, 10]
    assert events[-1]["text"].startswith(events[0]["text"])  # cumulative, as SGLang's native stream
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert "e2e_latency" in events[-1]["meta_info"] and "e2e_latency" not in events[0]["meta_info"]
    assert events[0]["meta_info"]["prompt_tokens"] == 7
    (rec,) = log_records(log)
    assert rec["api"] == "generate" and rec["n"] == 10 and rec["tpe"] == 3 and rec["pt"] == 7
    assert len(rec["t_us"]) == 4
    due_ms = [40 + 15 * j for j in range(4)]
    for t_us, due in zip(rec["t_us"], due_ms, strict=True):
        assert t_us / 1e3 >= due - 0.05  # never early (beyond the 20 us send-now window)
        assert t_us / 1e3 < due + 30  # and on time, give or take a loaded test box
    # the logged send time comes before the bytes reached the client, and not long before
    arrival = rec["arrival_ns"]
    assert t_sent <= arrival
    first_data_read = next(t for t, b in reads if b"data: " in b)
    assert arrival + rec["t_us"][0] * 1000 <= first_data_read < arrival + rec["t_us"][0] * 1000 + 50e6
    assert srv.report["requests"] == 1 and srv.report["events"] == 4 and srv.report["tokens"] == 10


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_streams_carry_usage_as_asked(tmp_path, path):
    log = tmp_path / "truth.jsonl"
    body = {"model": "m", "max_tokens": 5, "max_completion_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "one two three"}]
    else:
        body["prompt"] = [5, 6, 7]
    with TruthServer(str(log), ttft_ms=5, itl_ms=2, tokens_per_event=2) as srv:
        buf, _ = post(srv.port, path, body)
    events = [json.loads(e) for e in sse_events(buf)]
    content, usage_only = events[:-1], events[-1]
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] == 5
    assert [e["usage"]["completion_tokens"] for e in content] == [2, 4, 5]
    assert all(e["usage"]["prompt_tokens"] == 3 for e in content)
    if path.endswith("chat/completions"):
        texts = [e["choices"][0]["delta"]["content"] for e in content]
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    else:
        texts = [e["choices"][0]["text"] for e in content]
    assert [len(t.split()) for t in texts] == [2, 2, 1]
    assert texts[1].startswith(" ") and not texts[0].startswith(" ")  # words joined by single spaces
    assert [e["choices"][0]["finish_reason"] for e in content] == [None, None, "length"]
    (rec,) = log_records(log)
    assert rec["api"] in ("completions", "chat") and len(rec["t_us"]) == 3


def test_output_len_flag_and_whole_answers(tmp_path):
    log = tmp_path / "truth.jsonl"
    with TruthServer(str(log), ttft_ms=10, itl_ms=5, output_len=6) as srv:
        buf, _ = post(srv.port, "/v1/completions", {"model": "m", "prompt": "a b", "max_tokens": 100})
    obj = json.loads(buf.partition(b"\r\n\r\n")[2])
    assert obj["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    assert len(obj["choices"][0]["text"].split()) == 6
    (rec,) = log_records(log)
    assert rec["stream"] is False and len(rec["t_us"]) == 1
    assert rec["t_us"][0] / 1e3 >= 10 + 5 * 5 - 0.05  # the whole answer when its last token is due


def test_truth_statistics_from_a_log(tmp_path):
    log = tmp_path / "t.jsonl"
    recs = [
        # arrival 0 s: events sent at 50, 60, 75 ms (due 50, 60, 70: the last one 5 ms late)
        {"rid": 0, "api": "generate", "stream": True, "arrival_ns": 0, "t_us": [50_000, 60_000, 75_000],
         "done_us": 75_100, "ttft_us": 50_000, "itl_us": 10_000, "n": 3, "backlog": 1},
        # arrival 20 ms, overlapping the first: 2 in flight at once
        {"rid": 1, "api": "generate", "stream": True, "arrival_ns": 20_000_000, "t_us": [52_000, 62_000],
         "done_us": 62_100, "ttft_us": 50_000, "itl_us": 10_000, "n": 2, "backlog": 0},
        # a warm-up with one event, and an aborted stream: neither is scored
        {"rid": 2, "api": "generate", "stream": True, "arrival_ns": 1, "t_us": [50_000], "done_us": 50_000,
         "ttft_us": 50_000, "itl_us": 10_000, "n": 1},
        {"rid": 3, "api": "generate", "stream": True, "arrival_ns": 2, "t_us": [50_000], "done_us": 50_000,
         "ttft_us": 50_000, "itl_us": 10_000, "n": 4, "aborted": True},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tr = truth.analyze(str(log))
    assert tr["requests"] == 2 and tr["aborted"] == 1 and tr["output_tokens"] == 5
    assert tr["ttft_ms"]["mean"] == pytest.approx(51.0)
    assert sorted([tr["itl_ms"]["min"], tr["itl_ms"]["max"]]) == [pytest.approx(10.0), pytest.approx(15.0)]
    assert tr["lag_ms"]["max"] == pytest.approx(5.0) and tr["lag_ms"]["min"] == pytest.approx(0.0)
    assert tr["max_active"] == 2
    # first arrival 0 -> last send 20 + 62 ms
    assert tr["span_s"] == pytest.approx(0.082) and tr["output_tok_s"] == pytest.approx(5 / 0.082)
    assert tr["backlogged_events"] == 1


def test_several_processes_share_the_port_and_the_log(tmp_path):
    log = tmp_path / "truth.jsonl"
    with TruthServer(str(log), ttft_ms=0, itl_ms=0, extra=["--procs", "2"]) as srv:
        got = raw_run(srv.port, conc=32, num=96, out_len=64)
    assert got["requests"] == 96
    recs = log_records(log)  # every line parses: no two processes' lines interleave
    assert len(recs) == 96 and len({r["rid"] for r in recs}) == 96
    assert {r["rid"] % 2 for r in recs} == {0, 1}  # both processes served
    assert all(len(r["t_us"]) == 64 for r in recs)
    assert srv.report["procs"] == 2 and srv.report["reports"] == 2 and srv.report["tokens"] == 96 * 64


def test_words_are_slices_and_one_token_each(tmp_path):
    words = stream_words()
    assert len(set(words)) == len(words) and all(w.isalpha() and w.islower() for w in words)
    text = WordText(words)
    nw = len(words)
    assert text.span(0, 3).decode() == " ".join(words[:3])
    assert text.span(nw - 1, 3).decode() == " ".join([words[-1], words[0], words[1]])  # wraps round
    assert text.span_after_space(5, 2).decode() == " " + " ".join(words[5:7])
    assert len(text.span(17, 5000).split()) == 5000  # grows on demand
    from benchmarks.truthserver import tokdir

    tokdir.build(str(tmp_path / "tok"))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    sample = text.span(100, 300).decode()
    assert len(tok.encode(sample, add_special_tokens=False).ids) == 300
    assert "[UNK]" not in tok.encode(sample).tokens


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--ttft-ms", "-1"], "--ttft-ms"),
        (["--tokens-per-event", "0"], "--tokens-per-event"),
        (["--procs", "0"], "--procs"),
        (["--output-len", "-3"], "--output-len"),
        (["--slice-ms", "0"], "--slice-ms"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path, args, flag):
    cp = subprocess.run(
        [sys.executable, "-m", "benchmarks.truthserver", "--log", str(tmp_path / "l"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cp.returncode == 2 and flag in cp.stderr
    assert not (tmp_path / "l").exists()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_serving_processes_die_with_the_parent(tmp_path):
    srv = TruthServer(str(tmp_path / "l.jsonl"), extra=["--procs", "2"]).start()
    kids = _children(srv.pid)
    assert len(kids) == 2
    os.kill(srv.pid, signal.SIGKILL)
    srv.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{k}") and _alive(k) for k in kids):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{k}") and _alive(k) for k in kids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_arrival_is_when_the_request_reached_the_host_not_when_the_server_read_it(tmp_path):
    """A stopped (descheduled) server reads the request 0.3 s late: the truth still counts TTFT from
    the kernel's receive time, so the wait is the server's (lag, read_us), never a client's error."""
    log = tmp_path / "truth.jsonl"
    with TruthServer(str(log), ttft_ms=20, itl_ms=5) as srv:
        (child,) = _children(srv.pid)
        body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "stream": True})
        head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
            time.sleep(0.2)  # accepted before the stop
            os.kill(child, signal.SIGSTOP)
            try:
                sent = perf_counter_ns()
                s.sendall(head + body.encode())
                time.sleep(0.3)
            finally:
                os.kill(child, signal.SIGCONT)
            buf = b""
            while not buf.endswith(b"0\r\n\r\n"):
                buf += s.recv(65536)
    (rec,) = log_records(log)
    assert 0 <= rec["arrival_ns"] - sent < 50e6  # the kernel's time, not the late read
    assert rec["read_us"] >= 250_000
    assert rec["t_us"][0] >= 300_000  # the true TTFT includes the server's wait
