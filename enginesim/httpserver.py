"""A small HTTP/1.1 server on asyncio.Protocol: keep-alive, Content-Length and chunked bodies, SSE streams.

Why: the emulator must stream >= 50k token events/s on one core; a framework's per-event overhead
(ASGI message dicts, middleware) costs more than the whole scheduler. Each stream event is one
`transport.write` of a pre-framed chunk.

A request's arrival is the kernel's receive timestamp (SO_TIMESTAMPNS) of the read that completed it,
on the ``time.perf_counter`` clock: when its last byte reached this host, not when this process got
round to reading it. On a starved CPU the bytes wait in the socket for milliseconds; stamped at the
read, that wait was in every client's TTFT and in no evidence counter (issue 12). The transport's own
reads are paused and a duplicate of its socket is read with ``recvmsg``, which carries the stamp;
writes still go through the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
MAX_BODY = 256 << 20
SO_TIMESTAMPNS = 35  # Linux (asm-generic); the socket module has no name for it
KERNEL_STAMPS = sys.platform.startswith("linux")
_TIMESPEC = struct.Struct("@qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
READ_SIZE = 65536  # below malloc's mmap threshold: recvmsg allocates this much per read

# Stream chunks are buffered per connection and written together: one write per connection per flush.
# Writes made outside the engine loop are flushed by a call_soon callback. The engine computes a step
# before its deadline with HOLD set: everything the step writes (chunks, whole responses, closes) waits
# in HELD until the engine calls flush_held() at the deadline, so only the syscalls are left there.
PENDING: list[Conn] = []
HELD: list[Conn] = []
HOLD = [False]
_flush_scheduled = [False]


def _write_out(conns: list[Conn]) -> int:
    n = 0
    for c in conns:
        c.queued = False
        c.held = False
        out = c.out
        if out:
            if not c.closed and c.transport is not None:
                c.transport.write(out[0] if len(out) == 1 else b"".join(out))
                n += 1
            out.clear()
        if c.close_after:
            c.close_after = False
            if c.transport is not None:
                c.transport.close()
    conns.clear()
    return n


def flush_pending() -> int:
    """Write every buffered chunk that is not held for a deadline; returns the connections written."""
    _flush_scheduled[0] = False
    return _write_out(PENDING)


def flush_held() -> int:
    """Write what the engine's step queued under HOLD (at the step's deadline)."""
    return _write_out(HELD)


def _realtime_offset() -> float:
    """CLOCK_REALTIME - perf_counter now, from the tightest of three adjacent reads."""
    best = (1.0, 0.0)
    for _ in range(3):
        a = time.perf_counter()
        r = time.time()
        b = time.perf_counter()
        if b - a < best[0]:
            best = (b - a, r - (a + b) / 2)
    return best[1]


def kernel_stamp(ancillary: list[tuple[int, int, bytes]], now: float) -> float | None:
    """The SO_TIMESTAMPNS stamp among a read's ancillary data, on the perf_counter clock (never later
    than ``now``, the read's own time); None when the kernel gave none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return min(sec + nsec * 1e-9 - _realtime_offset(), now)
    return None


class Request:
    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        parts = urlsplit(target)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.headers = headers
        self.body = body


class Response:
    __slots__ = ("body", "content_type", "status")

    def __init__(self, status: int, body: bytes | str = b"", content_type: str = "application/json") -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.content_type = content_type


Handler = Callable[[Request, "Conn"], "Response | Awaitable[Response | None] | None"]


class Conn(asyncio.Protocol):
    """One client connection. Requests are handled one at a time (pipelined ones wait in the buffer)."""

    def __init__(self, dispatch: Callable[[Request, Conn], Any]) -> None:
        self.dispatch = dispatch
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.on_close: Callable[[], None] | None = None
        self.out: list[bytes] = []
        self.queued = False
        self.held = False  # queued in HELD (for a step's deadline), not in PENDING
        self.close_after = False
        self.read_at = 0.0  # arrival of the bytes read last (kernel stamp where there is one)
        self.arrival = 0.0  # the request being handled: the kernel's receive time of its last byte
        self.stamped: socket.socket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if KERNEL_STAMPS:
            self._read_stamped(transport)

    def _read_stamped(self, transport: asyncio.BaseTransport) -> None:
        """Read through a duplicate of the socket with recvmsg (for the stamps); where that cannot be
        set up, the transport keeps reading and a request's arrival is the read's own time.

        uvloop starts the transport's reads right after connection_made, so pausing them here is a
        no-op there: they are paused again on the next pass of the loop, and what already waits in
        the socket (a request sent with the connect, accepted late) is read now, stamped."""
        extra = getattr(transport, "get_extra_info", None)  # absent on a test double
        sock = extra("socket") if extra is not None else None
        if sock is None:
            return
        fd = -1
        try:
            fd = os.dup(sock.fileno())
            dup = socket.socket(fileno=fd)
            fd = -1
            dup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            loop = asyncio.get_running_loop()
            loop.add_reader(dup.fileno(), self._readable)
        except (OSError, RuntimeError, ValueError):
            if fd >= 0:
                os.close(fd)
            return
        self.stamped = dup
        transport.pause_reading()  # type: ignore[attr-defined]
        loop.call_soon(self._pause_transport)
        self._readable()

    def _pause_transport(self) -> None:
        if self.stamped is not None and self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def _readable(self) -> None:
        dup = self.stamped
        if dup is None:
            return
        try:
            data, ancillary, _, _ = dup.recvmsg(READ_SIZE, _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_stamped()
            if self.transport is not None:
                self.transport.abort()
            return
        if not data:  # the peer closed: as the transport does on EOF
            self._close_stamped()
            if self.transport is not None:
                self.transport.close()
            return
        now = time.perf_counter()
        stamp = kernel_stamp(ancillary, now)
        self.read_at = now if stamp is None else stamp
        self._received(data)

    def _close_stamped(self) -> None:
        dup, self.stamped = self.stamped, None
        if dup is not None:
            with contextlib.suppress(RuntimeError):  # no running loop (shutdown)
                asyncio.get_running_loop().remove_reader(dup.fileno())
            dup.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_stamped()
        self.closed = True
        cb = self.on_close
        self.on_close = None
        if cb is not None:
            cb()

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        self._received(data)

    def _received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._parse()

    def _parse(self) -> None:
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 65536:
                    self._simple_error(413, "header too large")
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self._simple_error(400, "malformed request line")
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            body_start = end + 4
            te = headers.get("transfer-encoding", "").lower()
            if "chunked" in te:
                body, consumed = self._dechunk(body_start)
                if body is None:
                    return
                del self.buf[:consumed]
            else:
                try:
                    length = int(headers.get("content-length", "0") or 0)
                except ValueError:
                    self._simple_error(400, "bad Content-Length")
                    return
                if length > MAX_BODY:
                    self._simple_error(413, "body too large")
                    return
                if len(self.buf) < body_start + length:
                    return
                body = bytes(self.buf[body_start : body_start + length])
                del self.buf[: body_start + length]
            conn_hdr = headers.get("connection", "").lower()
            self.keep_alive = not (
                conn_hdr == "close" or (version == "HTTP/1.0" and conn_hdr != "keep-alive")
            )
            self.busy = True
            self.arrival = self.read_at
            self.dispatch(Request(method, target, headers, body), self)

    def _dechunk(self, pos: int) -> tuple[bytes | None, int]:
        out = bytearray()
        buf = self.buf
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                return None, 0
            try:
                size = int(bytes(buf[pos:nl]).split(b";")[0], 16)
            except ValueError:
                self._simple_error(400, "bad chunk size")
                return None, 0
            if size == 0:
                end = buf.find(b"\r\n\r\n", nl)
                if end < 0:
                    return None, 0
                return bytes(out), end + 4
            if len(buf) < nl + 2 + size + 2:
                return None, 0
            out += buf[nl + 2 : nl + 2 + size]
            pos = nl + 2 + size + 2

    def _simple_error(self, status: int, msg: str) -> None:
        self.keep_alive = False
        self.send(Response(status, b'{"detail":"' + msg.encode() + b'"}'))

    # ---- responses --------------------------------------------------------------------------------
    def _queue(self, data: bytes) -> None:
        if HOLD[0] and self.queued and not self.held:
            self._write_pending_now()
        self.out.append(data)
        if not self.queued:
            self.queued = True
            if HOLD[0]:
                self.held = True
                HELD.append(self)
                return
            PENDING.append(self)
            if not _flush_scheduled[0]:
                _flush_scheduled[0] = True
                asyncio.get_running_loop().call_soon(flush_pending)

    def _write_pending_now(self) -> None:
        """A step's output for a connection that still waits in PENDING (e.g. a stream's header queued
        as its request arrived, just before the step that answers it was planned): write what was
        pending now and hold the step's part for its deadline. Left in PENDING, the step's output
        would leave with the next pending flush, before the step's emulated end (a one-token answer
        ahead of its own prefill step)."""
        PENDING.remove(self)
        self.queued = False
        if self.out:
            if not self.closed and self.transport is not None:
                self.transport.write(b"".join(self.out))
            self.out.clear()

    def send(self, resp: Response) -> None:
        if self.closed or self.transport is None:
            return
        head = (
            f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'OK')}\r\n"
            f"content-type: {resp.content_type}\r\ncontent-length: {len(resp.body)}\r\n"
            f"{'' if self.keep_alive else 'connection: close' + chr(13) + chr(10)}\r\n"
        ).encode()
        data = head + resp.body
        if HOLD[0]:
            self._queue(data)
            self._done()
            return
        if self.out:
            data = b"".join(self.out) + data
            self.out.clear()
        self.transport.write(data)
        self._done()

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream; charset=utf-8") -> None:
        if self.closed or self.transport is None:
            return
        self._queue(
            f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\ncontent-type: {content_type}\r\n"
            "cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n".encode()
        )

    def chunk(self, data: bytes) -> None:
        if not self.closed:
            self._queue(b"%x\r\n%b\r\n" % (len(data), data))

    def end_stream(self) -> None:
        if not self.closed:
            self._queue(b"0\r\n\r\n")
        self._done()

    def _done(self) -> None:
        self.on_close = None
        self.busy = False
        if not self.keep_alive:
            if HOLD[0]:
                self.close_after = True
                return
            if self.transport is not None:
                if self.out:
                    self.transport.write(b"".join(self.out))
                    self.out.clear()
                self.transport.close()
            return
        if self.buf:
            self._parse()


async def serve(host: str, port: int, dispatch: Callable[[Request, Conn], Any]) -> asyncio.base_events.Server:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(dispatch), host, port, reuse_address=True, backlog=4096)
    if KERNEL_STAMPS:
        # On the listener too: an accepted socket inherits it, so a request sent right after the
        # connect is stamped even when the accept itself came late (a starved CPU).
        for sock in server.sockets:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return server
