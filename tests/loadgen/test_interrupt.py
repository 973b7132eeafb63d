"""Interrupting loadgen keeps what it measured, and its workers never outlive it.

``timeout`` and quickmap's bench_case stop a client by signalling its whole process group; Ctrl-C in
a terminal does the same with SIGINT. Each test runs the real CLI in its own session against the
in-test server (every event 60 ms apart, so requests are mid-stream when the signal lands).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeserver import FakeServer
from lg_helpers import ROOT

MARKER = "Starting main benchmark run..."
HAND_BACK_S = 2.0  # signal -> result file written


def start(url: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", "--backend", "sglang", "--base-url", url, "--num-prompts", "40",
         "--max-concurrency", "4", "--random-input-len", "8", "--random-output-len", "40",
         "--random-range-ratio", "1", "--warmup-requests", "0", "--output-file", str(out), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def wait_for_main(p: subprocess.Popen, settle_s: float) -> None:
    deadline = time.monotonic() + 30
    for line in p.stdout:
        if line.strip() == MARKER or time.monotonic() > deadline:
            break
    time.sleep(settle_s)  # some requests done, some mid-stream


def wait_for_file(path: Path, limit_s: float) -> float:
    """Seconds until ``path`` exists (os.replace makes it appear whole), or inf past ``limit_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if path.exists():
            return time.monotonic() - t0
        time.sleep(0.01)
    return float("inf")


def workers_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_group_sigterm_hands_back_every_record_within_2s(tmp_path, workers):
    out = tmp_path / "r.json"
    with FakeServer(ttft=0.01, itl=0.06) as srv:
        p = start(srv.url, out, "--workers", workers)
        wait_for_main(p, 3.0)
        assert len(workers_of(p.pid)) == int(workers)
        os.killpg(p.pid, signal.SIGTERM)  # what timeout(1) and bench_case do
        took = wait_for_file(out, 10.0)
        _, err = p.communicate(timeout=30)
    assert took <= HAND_BACK_S, f"result written {took:.2f} s after SIGTERM"
    res = json.loads(out.read_text())
    done = [r for r in res["requests"] if r["success"]]
    cancelled = [r for r in res["requests"] if r["error_class"] == "cancelled"]
    assert len(done) >= 4 and res["completed"] == len(done)  # the finished requests came back
    assert 1 <= len(cancelled) <= 4  # the in-flight ones, marked
    assert all("SIGTERM" in r["error"] for r in cancelled)
    partial = [r for r in cancelled if r["event_times_s"]]
    assert partial, "no cancelled request kept the events it had received"
    for r in partial:
        assert r["event_times_s"] == sorted(r["event_times_s"]) and 0 < len(r["event_times_s"]) < 40
        assert len(r["event_tokens"]) == len(r["event_times_s"])
    # nothing was sent after the signal: every request is a record, none is left unaccounted for
    assert len(res["requests"]) == len(done) + len(cancelled) < 40
    assert res["complete"] is False and res["interrupted_by"] == "SIGTERM" and res["reliable"] is False
    assert any("interrupted by SIGTERM" in r for r in res["reliability"]["reasons"])
    assert p.returncode == 128 + signal.SIGTERM, err


def test_sigint_to_the_group_is_ctrl_c(tmp_path):
    out = tmp_path / "r.json"
    with FakeServer(ttft=0.01, itl=0.06) as srv:
        p = start(srv.url, out)
        wait_for_main(p, 3.0)
        os.killpg(p.pid, signal.SIGINT)
        took = wait_for_file(out, 10.0)
        p.communicate(timeout=30)
    assert took <= HAND_BACK_S
    assert p.returncode == 130
    res = json.loads(out.read_text())
    assert res["interrupted_by"] == "SIGINT" and res["complete"] is False
    assert res["errors_by_class"].get("cancelled", 0) >= 1 and res["completed"] >= 1


def test_a_worker_never_outlives_its_parent(tmp_path):
    out = tmp_path / "r.json"
    with FakeServer(ttft=0.01, itl=0.06) as srv:
        p = start(srv.url, out, "--workers", "2")
        wait_for_main(p, 1.0)
        kids = workers_of(p.pid)
        assert len(kids) == 2
        p.kill()  # SIGKILL: no handler runs in the parent
        p.wait(timeout=30)  # (not communicate: a surviving worker would hold the pipes open)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.05)
        left = [k for k in kids if alive(k)]
        for k in left:  # never leave them behind, whatever the verdict
            os.kill(k, signal.SIGKILL)
        p.communicate(timeout=30)
    assert not left, f"workers {left} outlived their parent by 5 s"
    assert not out.exists()  # nobody could write the result: the parent was killed


@pytest.mark.parametrize("when", ["planning", "main phase"])
def test_under_timeout_the_result_is_written(tmp_path, when):
    """GNU timeout signals loadgen and then its whole group, so loadgen gets SIGTERM twice; the second
    must not cut the hand-back short. Fired while the prompts are still being made, the result says
    so with no requests; fired in the main phase, it holds the records."""
    out = tmp_path / "r.json"
    if when == "planning":  # a million prompts take seconds to make; timeout fires first
        args = ["--num-prompts", "1000000", "--random-input-len", "1", "--random-output-len", "1"]
        limit = "4"  # after start-up (up to 2 s on a loaded box), long before the prompts are made
    else:
        args = ["--num-prompts", "40", "--random-input-len", "8", "--random-output-len", "40"]
        limit = "8"  # a few of the 10 rounds of 2.4 s done
    with FakeServer(ttft=0.01, itl=0.06) as srv:
        cp = subprocess.run(
            ["timeout", "-s", "TERM", limit, sys.executable, "-m", "loadgen", "--backend", "sglang",
             "--base-url", srv.url, "--max-concurrency", "4", "--random-range-ratio", "1",
             "--warmup-requests", "0", "--output-file", str(out), *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert cp.returncode == 124, cp.stderr  # timeout's own code: it fired
    assert "Traceback" not in cp.stderr, cp.stderr
    res = json.loads(out.read_text())
    assert res["complete"] is False and res["interrupted_by"] == "SIGTERM"
    if when == "planning":
        assert res["requests"] == [] and res["num_prompts"] == 1000000
    else:
        assert res["completed"] >= 1 and res["errors_by_class"].get("cancelled", 0) >= 1
