"""An event's time is when it reached the client host, even if the client was not running then.

The server below stops the whole loadgen process group (SIGSTOP: a descheduled client, as on a
busy box) before it writes the first event and lets it run again STALL_S later. With kernel receive
timestamps (the default on Linux) TTFT and ITL keep the true send times; with read times the stall
lands in TTFT and is taken out of the next gap.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from lg_conn_fakes import chunk
from lg_helpers import ROOT

from loadgen.httpconn import SO_TIMESTAMPNS, KConn

STALL_S = 0.25
GAP_S = 0.40  # first event -> second event, as sent
SLACK_MS = 100  # the request's way to the server, and read delays, on a slow test host
# The kernel stamps on CLOCK_REALTIME, moved onto CLOCK_MONOTONIC at the read: a wall-clock
# correction between stamp and read (this VM's host corrects it: 0.96 ms once, in a 200 ms window)
# moves the converted stamp by as much, either way.
CLOCK_SLACK_MS = 5


def _event(tokens: int, last: bool) -> bytes:
    fin = {"type": "length", "length": 2} if last else None
    meta = {"prompt_tokens": 8, "completion_tokens": tokens, "cached_tokens": 0, "finish_reason": fin}
    return chunk(b"data: " + json.dumps({"text": "w " * tokens, "meta_info": meta}).encode() + b"\n\n")


class StallingServer:
    """Answers one /generate with two events; stops the client's process group around the first."""

    def __init__(self) -> None:
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self.pgid: int | None = None
        self.sent_ns: list[int] = []
        self.arrival_ns = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.lsock.accept()
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        except OSError:
            return  # listening socket closed

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, body = buf.partition(b"\r\n\r\n")
                m = re.search(rb"content-length: *(\d+)", head, re.I)
                while m and len(body) < int(m.group(1)):
                    body += conn.recv(65536)
                self.arrival_ns = time.perf_counter_ns()
                if not head.startswith(b"POST /generate "):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    return
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                os.killpg(self.pgid, signal.SIGSTOP)
                try:
                    self.sent_ns.append(time.perf_counter_ns())
                    conn.sendall(_event(1, False))
                    time.sleep(STALL_S)
                finally:
                    os.killpg(self.pgid, signal.SIGCONT)
                time.sleep(max(0.0, (self.sent_ns[0] + GAP_S * 1e9 - time.perf_counter_ns()) / 1e9))
                self.sent_ns.append(time.perf_counter_ns())
                conn.sendall(_event(2, True) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                conn.recv(1)  # until the client closes
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux-only")
@pytest.mark.parametrize("source", ["kernel", "read"])
def test_a_stalled_client_still_times_events_by_their_arrival(tmp_path, source):
    srv = StallingServer()
    srv.thread.start()
    out = tmp_path / "bench.json"
    args = ["--backend", "sglang", "--port", str(srv.port), "--num-prompts", "1", "--max-concurrency", "1"]
    args += ["--random-input-len", "8", "--random-output-len", "2", "--random-range-ratio", "1"]
    args += ["--warmup-requests", "0", "--workers", "1", "--output-file", str(out)]
    if source == "read":
        args += ["--timestamps", "read"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    srv.pgid = proc.pid
    try:
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            proc.kill()
        srv.lsock.close()
    assert srv.error is None, srv.error
    assert proc.returncode == 0, stderr
    res = json.loads(out.read_text())
    assert res["timestamps"] == source and res["completed"] == 1
    assert res["reads_without_kernel_stamp"] == 0
    req = res["requests"][0]
    true_ttft_ms = (srv.sent_ns[0] - srv.arrival_ns) / 1e6
    true_gap_ms = (srv.sent_ns[1] - srv.sent_ns[0]) / 1e6
    itl_ms = res["mean_itl_ms"]
    if source == "kernel":
        # the client's TTFT also holds the request's way to the server (a few ms here)
        lo, hi = true_ttft_ms - CLOCK_SLACK_MS, true_ttft_ms + SLACK_MS
        assert lo <= req["ttft_ms"] < hi, (req["ttft_ms"], true_ttft_ms)
        assert abs(itl_ms - true_gap_ms) < SLACK_MS, (itl_ms, true_gap_ms)
    else:
        assert req["ttft_ms"] >= true_ttft_ms + STALL_S * 1000, (req["ttft_ms"], true_ttft_ms)
        assert itl_ms <= true_gap_ms - STALL_S * 1000 + SLACK_MS, (itl_ms, true_gap_ms)


class _Probe(KConn):
    """KConn's read path with the parser replaced by a recorder of the event time it would use."""

    def on_data(self, data, t):
        self.got = (data, t)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        client = socket.create_connection(lsock.getsockname())
        server, _ = lsock.accept()
    client.setblocking(False)
    return client, server


def _wait_for_stamps(client: socket.socket, server: socket.socket) -> None:
    """The kernel switches receive stamping on from a work queue when the first socket asks for
    it; until then segments arrive unstamped. Probe until one comes back stamped."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        server.sendall(b"p")
        time.sleep(0.01)
        _data, anc, _flags, _addr = client.recvmsg(16, 64)
        if anc:
            return
    raise AssertionError("the kernel never stamped a received segment")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux-only")
@pytest.mark.parametrize("stamped", [True, False])
def test_read_path_uses_the_kernel_stamp_on_the_monotonic_base_or_counts_the_fallback(stamped):
    client, server = _tcp_pair()
    with client, server:
        if stamped:
            client.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            _wait_for_stamps(client, server)
        probe = _Probe(owner=None)
        probe.sock = client
        before = KConn.unstamped_reads
        sent = time.perf_counter_ns()
        server.sendall(b"x" * 100)
        time.sleep(0.2)  # the bytes wait in the socket; the read comes late
        probe._readable()
        read_at = time.perf_counter_ns()
    data, t = probe.got
    assert data == b"x" * 100
    if stamped:
        slack = CLOCK_SLACK_MS * 1_000_000
        assert sent - slack <= t < sent + 50_000_000, (t - sent) / 1e6  # arrival, not the read 200 ms on
        assert KConn.unstamped_reads == before
    else:
        assert read_at - 50_000_000 < t <= read_at
        assert KConn.unstamped_reads == before + 1
