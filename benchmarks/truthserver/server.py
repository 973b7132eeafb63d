"""The schedule, the HTTP connections and the truth log of one truthserver process.

Streams that are due now wait in a round-robin queue; later deadlines wait in a heap behind one
timer. A pass sends one event per due stream and yields to the event loop after ``--slice-ms`` so
new requests are read on time. Each finished (or aborted) request becomes one line of the truth log.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
import resource
import socket
import time
from collections import deque
from time import perf_counter_ns

from .stream import Settings, Stream, json_response, prompt_tokens
from .wakeup import Wakeup
from .words import WordText, stream_words

try:  # several times faster for the per-request log line; the standard library does the same job
    import orjson

    def _dumps(obj: dict) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover

    def _dumps(obj: dict) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


EARLY_NS = 20_000  # an event due within 20 µs is sent now (a wake-up costs about that much)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
EMPTY_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
LOG_FLUSH_BYTES = 1 << 20


class Server:
    """The schedule of one serving process: streams due now (round robin) and a heap of later
    deadlines, on one timer; and its share of the truth log."""

    def __init__(self, s: Settings, log_path: str, proc: int, procs: int) -> None:
        self.s = s
        self.text = WordText(stream_words())
        self.ready: deque[Stream] = deque()
        self.heap: list[tuple[int, int, Stream]] = []
        self.seq = itertools.count()
        self.rids = itertools.count(proc, procs)  # unique over the processes
        self.loop = asyncio.get_running_loop()
        self.wakeup = Wakeup(self.loop, self.pump)
        self.timer_due = 0  # the deadline the wake-up is armed for (0: none)
        self.pump_queued = False
        self.active = 0
        self.logfd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.logbuf: list[bytes] = []
        self.logbytes = 0
        self.stats = {"requests": 0, "finished": 0, "aborted": 0, "events": 0, "tokens": 0}
        self.busy_ns = 0

    # -- scheduling ------------------------------------------------------------------------------
    def admit(self, st: Stream) -> None:
        self.active += 1
        self.stats["requests"] += 1
        self.place(st, st.next_due())

    def place(self, st: Stream, due: int) -> None:
        if due <= perf_counter_ns() + EARLY_NS:
            self.ready.append(st)
            if not self.pump_queued:
                self.pump_queued = True
                self.loop.call_soon(self.pump)
        else:
            heapq.heappush(self.heap, (due, next(self.seq), st))
            self.arm(due)

    def arm(self, due: int) -> None:
        if self.pump_queued:
            return
        if self.timer_due and self.timer_due <= due:
            return
        self.timer_due = due
        self.wakeup.arm(due)

    def pump(self) -> None:
        """Send every due event, one per stream per round, yielding to the loop after a slice."""
        self.timer_due = 0
        self.pump_queued = False
        heap, ready = self.heap, self.ready
        popleft, append = ready.popleft, ready.append
        t0 = now = perf_counter_ns()
        limit = now + self.s.slice_ns
        sent = 0
        while True:
            horizon = now + EARLY_NS
            while heap and heap[0][0] <= horizon:
                append(heapq.heappop(heap)[2])
            if not ready:
                break
            for _ in range(len(ready)):
                st = popleft()
                if st.dead:
                    continue
                if st.conn.paused:
                    st.parked = True  # resume_writing() puts it back
                    continue
                due = st.emit(self)
                sent += 1
                if due < 0:
                    continue
                if due <= horizon:
                    append(st)
                else:
                    heapq.heappush(heap, (due, next(self.seq), st))
            now = perf_counter_ns()
            if now >= limit:
                break
        self.stats["events"] += sent
        self.busy_ns += now - t0
        if ready:
            if not self.pump_queued:
                self.pump_queued = True
                self.loop.call_soon(self.pump)
        elif heap:
            self.arm(heap[0][0])

    def resume(self, st: Stream) -> None:
        if st.parked and not st.dead:
            st.parked = False
            self.place(st, st.next_due())

    # -- the truth log ---------------------------------------------------------------------------
    def finish(self, st: Stream, done_ns: int, aborted: bool = False) -> None:
        st.dead = True
        self.active -= 1
        a = st.arrival_ns
        rec = st.rec
        rec["t_us"] = [round((t - a) / 1e3) for t in st.sends]
        rec["done_us"] = round((done_ns - a) / 1e3)
        rec["backlog"] = st.backlog
        rec["paused"] = st.conn.pause_count
        if aborted:
            rec["aborted"] = True
            self.stats["aborted"] += 1
        else:
            self.stats["finished"] += 1
            self.stats["tokens"] += st.n
        line = _dumps(rec) + b"\n"
        self.logbuf.append(line)
        self.logbytes += len(line)
        if self.logbytes > LOG_FLUSH_BYTES:
            self.flush_log()
        st.conn.stream_over(st)

    def flush_log(self) -> None:
        """Whole lines in one write: appends from several processes never interleave inside a line."""
        if self.logbuf:
            data = b"".join(self.logbuf)
            self.logbuf = []
            self.logbytes = 0
            view = memoryview(data)
            while view:
                view = view[os.write(self.logfd, view) :]

    def flush_every_second(self) -> None:
        self.flush_log()
        self.loop.call_later(1.0, self.flush_every_second)

    def close(self) -> dict:
        self.flush_log()
        os.close(self.logfd)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return dict(self.stats, cpu_s=ru.ru_utime + ru.ru_stime, busy_s=self.busy_ns / 1e9)


NOOP_POSTS = {b"/flush_cache", b"/reset_prefix_cache", b"/start_profile", b"/stop_profile"}
APIS = {
    b"/generate": "generate",
    b"/v1/completions": "completions",
    b"/v1/chat/completions": "chat",
}


class Conn(asyncio.Protocol):
    """One client connection: parses requests one at a time (keep-alive), hands streams to the Server."""

    def __init__(self, srv: Server, gets: dict[bytes, bytes]) -> None:
        self.srv = srv
        self.gets = gets
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.stream: Stream | None = None
        self.paused = False
        self.pause_count = 0
        self.close_after = False
        self.first_byte_ns = 0
        self.conn_ns = perf_counter_ns()
        self.nreq = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        st = self.stream
        if st is not None and not st.dead:
            self.srv.finish(st, perf_counter_ns(), aborted=True)
        self.stream = None

    def pause_writing(self) -> None:
        self.paused = True
        self.pause_count += 1

    def resume_writing(self) -> None:
        self.paused = False
        if self.stream is not None:
            self.srv.resume(self.stream)

    def data_received(self, data: bytes) -> None:
        if not self.first_byte_ns:
            self.first_byte_ns = perf_counter_ns()
        self.buf += data
        if self.stream is None:
            self.process()

    def stream_over(self, st: Stream) -> None:
        self.stream = None
        if self.close_after:
            self.transport.close()
        elif self.buf:
            self.process()

    def _request(self) -> tuple[str, bytes, bytes, bool] | None:
        """(method, path, body, close) of the next complete request in the buffer, or None."""
        buf = self.buf
        he = buf.find(b"\r\n\r\n")
        if he < 0:
            return None
        lines = buf[:he].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            raise ValueError(f"bad request line {lines[0][:100]!r}")
        method, target, version = parts
        hdrs = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
        pos = he + 4
        if b"chunked" in hdrs.get(b"transfer-encoding", b"").lower():
            body, end = b"", pos
            while True:
                le = buf.find(b"\r\n", end)
                if le < 0:
                    return None
                size = int(buf[end:le].split(b";")[0], 16)
                if size == 0:
                    te = buf.find(b"\r\n\r\n", le)
                    if te < 0:
                        return None
                    end = te + 4
                    break
                if len(buf) < le + 2 + size + 2:
                    return None
                body += buf[le + 2 : le + 2 + size]
                end = le + 2 + size + 2
        else:
            cl = int(hdrs.get(b"content-length", b"0") or 0)
            end = pos + cl
            if len(buf) < end:
                return None
            body = buf[pos:end]
        self.buf = buf[end:]
        conn = hdrs.get(b"connection", b"").lower()
        close = conn == b"close" or (version == b"HTTP/1.0" and conn != b"keep-alive")
        return method.decode("latin-1"), target.split(b"?", 1)[0], body, close

    def process(self) -> None:
        while self.stream is None and self.buf:
            try:
                got = self._request()
            except ValueError as exc:
                self.transport.write(json_response({"error": str(exc)}, b"400 Bad Request"))
                self.transport.close()
                return
            if got is None:
                return
            first_byte = self.first_byte_ns
            self.first_byte_ns = perf_counter_ns() if self.buf else 0
            method, path, body, self.close_after = got
            self.handle(method, path, body, first_byte)
            if self.close_after and self.stream is None:
                self.transport.close()
                return

    def handle(self, method: str, path: bytes, body: bytes, first_byte_ns: int) -> None:
        tr = self.transport
        if method in ("GET", "HEAD"):
            tr.write(
                self.gets.get(path.rstrip(b"/"), json_response({"error": "not found"}, b"404 Not Found"))
            )
            return
        if method != "POST":
            tr.write(json_response({"error": f"method {method}"}, b"405 Method Not Allowed"))
            return
        if path in NOOP_POSTS:
            tr.write(json_response({"success": True}))
            return
        api = APIS.get(path)
        if api is None:
            tr.write(json_response({"error": "not found"}, b"404 Not Found"))
            return
        arrival = perf_counter_ns()
        wall = time.time()
        try:
            req = json.loads(body) if body else {}
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            tr.write(json_response({"error": f"bad JSON body: {exc}"}, b"400 Bad Request"))
            return
        srv = self.srv
        self.nreq += 1
        rec = {
            "rid": next(srv.rids),
            "api": api,
            "stream": bool(req.get("stream", False)),
            "wall": wall,
            "arrival_ns": arrival,
            "first_byte_us": round((first_byte_ns - arrival) / 1e3) if first_byte_ns else 0,
            "conn_us": round((self.conn_ns - arrival) / 1e3),
            "req_on_conn": self.nreq,
            "pt": prompt_tokens(api, req),
            "ttft_us": srv.s.ttft_ns / 1e3,
            "itl_us": srv.s.itl_ns / 1e3,
        }
        st = Stream(srv, self, api, req, rec)
        self.stream = st
        if st.streamed:
            tr.write(SSE_HEAD)
        srv.admit(st)


def static_gets(s: Settings, port: int) -> dict[bytes, bytes]:
    models = {
        "object": "list",
        "data": [
            {"id": s.model, "object": "model", "created": 0, "owned_by": "truthserver", "root": s.model}
        ],
    }
    info = {"model_path": s.model, "tokenizer_path": s.model, "is_generation": True}
    server_info = {
        "model_path": s.model,
        "served_model_name": s.model,
        "port": port,
        "version": "truthserver",
        "context_length": 1 << 20,
    }
    return {
        b"/health": EMPTY_OK,
        b"/health_generate": EMPTY_OK,
        b"/v1/models": json_response(models),
        b"/get_model_info": json_response(info),
        b"/model_info": json_response(info),
        b"/get_server_info": json_response(server_info),
        b"/server_info": json_response(server_info),
        b"/metrics": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n",
    }
