"""One client connection of truthserver: plain non-blocking sockets, a request's kernel arrival time.

A request's arrival is the kernel's receive timestamp (SO_TIMESTAMPNS) of the read that completed
it, moved onto the ``perf_counter_ns`` clock: when its last byte reached this host, not when this
process got round to it. A busy or descheduled server therefore cannot shorten the true TTFT (the
time the request waited unread counts against the server, as ``read_us`` and as lag), and a client
is scored only on what it did. Where the kernel gives no stamp (not Linux, or the first packets
before stamping is switched on), the read's own time stands in and ``unstamped`` counts it.

Writes go straight to the socket; what the kernel cannot take yet waits in a bounded buffer, and a
stream whose connection holds more than ``HIGH_WATER`` bytes pauses until it drains below
``LOW_WATER`` (uvloop's transport defaults).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import time
from collections import deque
from time import perf_counter_ns, time_ns
from typing import TYPE_CHECKING

from .stream import Stream, json_response, prompt_tokens

if TYPE_CHECKING:
    from .server import Server

SO_TIMESTAMPNS = 35  # Linux (asm-generic); socket has no name for it
KERNEL_STAMPS = sys.platform.startswith("linux")
_TS = struct.Struct("@qq")
CMSG_SPACE = socket.CMSG_SPACE(_TS.size)
READ_SIZE = 65536
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
NOOP_POSTS = {b"/flush_cache", b"/reset_prefix_cache", b"/start_profile", b"/stop_profile"}
APIS = {b"/generate": "generate", b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now, from adjacent reads (the tightest of three tries: a
    preemption between the two reads would shift every stamp converted with it)."""
    best = None
    for _ in range(3):
        a = perf_counter_ns()
        r = time_ns()
        b = perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


class Listener:
    """Accepts connections on a listening socket the parent bound (SO_REUSEPORT across processes)."""

    def __init__(self, srv: Server, sock: socket.socket, gets: dict[bytes, bytes]) -> None:
        self.srv = srv
        self.sock = sock
        self.gets = gets
        self.loop = asyncio.get_running_loop()
        self.conns: set[Conn] = set()
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: the client sees a refused or reset connect
                return
            self.conns.add(Conn(self, s))

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for c in list(self.conns):
            c.close()


class Conn:
    """Parses requests one at a time (keep-alive) and hands each stream to the Server."""

    def __init__(self, listener: Listener, sock: socket.socket) -> None:
        self.listener = listener
        self.srv = listener.srv
        self.gets = listener.gets
        self.loop = listener.loop
        self.sock = sock
        self.fd = sock.fileno()
        self.conn_ns = perf_counter_ns()
        self.buf = b""
        self.last_read_ns = 0  # arrival of the bytes most recently read (kernel stamp when there is one)
        self.stream: Stream | None = None
        self.out: deque[bytes] = deque()
        self.out_size = 0
        self.paused = False
        self.pause_count = 0
        self.close_after = False
        self.closed = False
        self.nreq = 0
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if KERNEL_STAMPS:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.loop.add_reader(self.fd, self._readable)

    # -- reading -------------------------------------------------------------------------------------
    def _readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(READ_SIZE, CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        now = perf_counter_ns()
        t = now
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= _TS.size:
                sec, nsec = _TS.unpack_from(cdata)
                t = min(sec * 1_000_000_000 + nsec - realtime_offset_ns(), now)
                break
        else:
            self.srv.stats["unstamped_reads"] += 1
        self.last_read_ns = t
        self.buf += data
        if self.stream is None:
            self.process()

    # -- writing (the Stream calls these two) --------------------------------------------------------
    def get_write_buffer_size(self) -> int:
        return self.out_size

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.close()
                return
            if n == len(data):
                return
            data = data[n:]
            self.loop.add_writer(self.fd, self._writable)
        self.out.append(data)
        self.out_size += len(data)
        if not self.paused and self.out_size > HIGH_WATER:
            self.paused = True
            self.pause_count += 1

    def _writable(self) -> None:
        out = self.out
        while out:
            chunk = out[0]
            try:
                n = self.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            self.out_size -= n
            if n < len(chunk):
                out[0] = chunk[n:]
                break
            out.popleft()
        if not out:
            self.loop.remove_writer(self.fd)
            if self.close_after and self.stream is None:
                self.close()
                return
        if self.paused and self.out_size <= LOW_WATER:
            self.paused = False
            if self.stream is not None:
                self.srv.resume(self.stream)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.out:
            self.loop.remove_writer(self.fd)
        self.sock.close()
        self.listener.conns.discard(self)
        st = self.stream
        if st is not None and not st.dead:
            self.srv.finish(st, perf_counter_ns(), aborted=True)
        self.stream = None

    def _close_when_sent(self) -> None:
        if self.out:
            self.close_after = True  # _writable closes once the rest is out
        else:
            self.close()

    # -- requests ------------------------------------------------------------------------------------
    def stream_over(self, st: Stream) -> None:
        self.stream = None
        if self.close_after:
            self._close_when_sent()
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
        while self.stream is None and self.buf and not self.closed:
            try:
                got = self._request()
            except ValueError as exc:
                self.write(json_response({"error": str(exc)}, b"400 Bad Request"))
                self._close_when_sent()
                return
            if got is None:
                return
            method, path, body, self.close_after = got
            self.handle(method, path, body)
            if self.close_after and self.stream is None:
                self._close_when_sent()
                return

    def handle(self, method: str, path: bytes, body: bytes) -> None:
        if method in ("GET", "HEAD"):
            missing = json_response({"error": "not found"}, b"404 Not Found")
            self.write(self.gets.get(path.rstrip(b"/")) or missing)
            return
        if method != "POST":
            self.write(json_response({"error": f"method {method}"}, b"405 Method Not Allowed"))
            return
        if path in NOOP_POSTS:
            self.write(json_response({"success": True}))
            return
        api = APIS.get(path)
        if api is None:
            self.write(json_response({"error": "not found"}, b"404 Not Found"))
            return
        parsed = perf_counter_ns()
        arrival = self.last_read_ns or parsed  # the request's last byte reached the host
        wall = time.time() - (parsed - arrival) / 1e9
        try:
            req = json.loads(body) if body else {}
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self.write(json_response({"error": f"bad JSON body: {exc}"}, b"400 Bad Request"))
            return
        srv = self.srv
        self.nreq += 1
        rec = {
            "rid": next(srv.rids),
            "api": api,
            "stream": bool(req.get("stream", False)),
            "wall": wall,
            "arrival_ns": arrival,
            "read_us": round((parsed - arrival) / 1e3),
            "conn_us": round((self.conn_ns - arrival) / 1e3),
            "req_on_conn": self.nreq,
            "pt": prompt_tokens(api, req),
            "ttft_us": srv.s.ttft_ns / 1e3,
            "itl_us": srv.s.itl_ns / 1e3,
        }
        st = Stream(srv, self, api, req, rec)
        self.stream = st
        if st.streamed:
            self.write(SSE_HEAD)
        srv.admit(st)
