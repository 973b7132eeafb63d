"""Events read together carry one time: past 0.5% of the gaps, loadgen stops calling its ITL reliable.

When a client falls behind a stream (descheduled, or a box too busy to read), several events of one
stream come back from one read and all get the last one's time; the ITL and TTFT percentiles are then
wrong, however precise the clock. The self-check counts such events and says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from fakeserver import FakeServer
from lg_helpers import ROOT

from loadgen.records import RequestRecord
from loadgen.results import READ_TOGETHER_LIMIT, build

MS = 1_000_000


def record(index: int, ev_times: list[int]) -> RequestRecord:
    return RequestRecord(index, 0, 0, 1, ev_times[-1] + 1, 200, None, None, ev_times, [1] * len(ev_times),
                         len(ev_times), 8, "server", 0, 1, 0)  # fmt: skip


def result_of(records: list[RequestRecord]) -> dict:
    cfg = {"t0_epoch_s": 0.0, "backend": "sglang"}
    return build(cfg, records, 0, 0, 10**10, [0.001] * 10, False, True, 25.0, [])


def test_a_few_events_read_together_are_tolerated_many_are_not():
    steady = [record(i, [10 * MS * (k + 1) for k in range(100)]) for i in range(10)]  # 990 gaps
    few = [*steady[:9], record(9, [*(10 * MS * (k + 1) for k in range(96)), *[970 * MS] * 4])]  # 3 gaps of 0
    many = [record(i, [10 * MS * (k // 2 + 1) for k in range(100)]) for i in range(10)]  # every other one
    res = result_of(steady)
    assert res["reliable"] is True and res["reliability"]["events_read_together"] == 0
    res = result_of(few)
    assert res["reliability"]["events_read_together"] == 3 and READ_TOGETHER_LIMIT * 990 > 3
    assert res["reliable"] is True
    res = result_of(many)
    assert res["reliable"] is False and res["reliability"]["events_read_together"] == 500
    assert any(
        "were read together with the next event of their stream" in r for r in res["reliability"]["reasons"]
    )


def test_a_stalled_client_reads_events_together_and_says_so(tmp_path):
    """SIGSTOP the client for 0.4 s while 4 streams send an event every 5 ms: on waking it reads
    ~80 events per stream at once, their times are all the last one's; the run must not be reliable."""
    out = tmp_path / "r.json"
    with FakeServer(ttft=0.02, itl=0.005) as srv:
        p = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "--backend", "sglang", "--base-url", srv.url,
             "--num-prompts", "4", "--max-concurrency", "4", "--random-input-len", "8",
             "--random-output-len", "400", "--random-range-ratio", "1", "--warmup-requests", "0",
             "--output-file", str(out)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        for line in p.stdout:
            if line.strip() == "Starting main benchmark run...":
                break
        time.sleep(0.3)
        os.killpg(p.pid, signal.SIGSTOP)
        time.sleep(0.4)
        os.killpg(p.pid, signal.SIGCONT)
        p.communicate(timeout=60)
    res = json.loads(out.read_text())
    assert res["completed"] == 4
    assert res["reliability"]["events_read_together"] >= 4 * 40
    assert res["reliable"] is False
    assert any("read together" in r for r in res["reliability"]["reasons"])
