"""A minimal HTTP/1.1 client connection on asyncio.Protocol, built for timing accuracy.

Why not httpx/aiohttp: the loadgen benchmark (README.md) showed that their per-chunk overhead
(stream readers, futures, header objects) delays the read of other streams' events by milliseconds
at high concurrency, which is exactly the error we must not have. This client does the least work
possible when bytes arrive: one ``perf_counter_ns`` call first, then de-chunking and SSE framing by
``bytes.find``; JSON decoding is left to the backend (usually after the request is finished).

One ``Conn`` carries one request at a time (keep-alive, no pipelining). A request object (see
``backends.Req``) is handed over with ``send``; the connection calls
``req.on_event(t_ns, buf, start, end)`` for each complete SSE ``data:`` payload ``buf[start:end]``
(bounds, not a copy: native SGLang events grow with the output), and
``owner.request_done(conn, req)`` once the response is over (or failed; ``req.error_class``/
``req.error`` are set then).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from time import perf_counter_ns, time_ns

# response parser states
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _LENGTH, _UNTIL_CLOSE, _IDLE = range(8)

MAX_ERROR_BODY = 2000
_TS = struct.Struct("@qq")


def build_request(method: str, host: str, path: str, body: bytes | None, extra_headers: str = "") -> bytes:
    """Serialize one HTTP/1.1 request (headers + body) so sending is a single write."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: loadgen\r\nAccept: */*\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head += extra_headers + "\r\n"
    return head.encode("latin-1") + (body or b"")


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with an incremental response + SSE parser."""

    __slots__ = (
        "_buf",
        "_close_after",
        "_hot",
        "_is_sse",
        "_rem",
        "_sbuf",
        "_state",
        "body_parts",
        "closed",
        "fresh",
        "got_bytes",
        "owner",
        "req",
        "served",
        "transport",
    )

    def __init__(self, owner) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.req = None
        self.closed = False
        self._state = _IDLE
        self._buf = b""
        self._sbuf = b""
        self._rem = 0
        self._is_sse = False
        self._close_after = False
        self._hot = False  # in an SSE chunked body at a chunk boundary, nothing buffered: see on_data
        self.body_parts: list[bytes] = []
        self.got_bytes = False
        self.served = 0  # requests sent on this connection so far
        self.fresh = False  # opened for the request it carries (so it cannot have idled out)

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        req = self.req
        if req is None:
            self.owner.conn_closed(self)
            return
        if self._state == _UNTIL_CLOSE:
            self._finish()
        elif req.error_class is None:
            if not self.got_bytes:
                req.error_class = "connection"
                req.error = f"connection closed before any response byte: {exc or 'EOF'}"
            else:
                req.error_class = "stream_cut"
                req.error = f"connection closed mid-response: {exc or 'EOF'}"
            self._finish()
        else:
            self._finish()
        self.owner.conn_closed(self)

    def eof_received(self):
        return False  # close the transport; connection_lost does the accounting

    # -- sending -------------------------------------------------------------------------------
    def send(self, req, payload: bytes) -> None:
        """Hand one request to the socket; ``req.send_ns`` is stamped right before the write."""
        self.req = req
        self._state = _HEAD
        self._buf = b""
        self._sbuf = b""
        self._rem = 0
        self._is_sse = False
        self._close_after = False
        self._hot = False
        self.body_parts = []
        self.got_bytes = False
        self.served += 1
        req.send_ns = perf_counter_ns()
        self._write(payload)

    def _write(self, data: bytes) -> None:
        self.transport.write(data)

    def _close(self) -> None:
        self.closed = True
        self.transport.close()

    def _abort(self) -> None:
        self.transport.abort()

    def fail(self, error_class: str, error: str) -> None:
        """Abort the in-flight request (timeout, cancel): the connection is dropped, not reused."""
        req = self.req
        if req is not None and req.error_class is None:
            req.error_class = error_class
            req.error = error
        if not self.closed:
            self._abort()

    # -- receiving -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.on_data(data, perf_counter_ns())

    def on_data(self, data: bytes, t: int) -> None:
        """Bytes that arrived at ``t`` (perf_counter_ns clock).

        Hot path: while the stream sits at a chunk boundary of an SSE body with nothing buffered
        (``_hot``, recomputed after every read the full path handled), the read goes straight to
        ``_fast``; only what it cannot frame (a chunk or event cut by the read boundary, the last
        chunk, anything unusual) takes the full path."""
        if self._hot:
            pos = self._fast(data, 0, t, self.req)
            if pos == len(data):
                return
            self._hot = False
            if pos:
                data = data[pos:]
        self._on_data(data, t)
        req = self.req
        self._hot = (
            req is not None
            and self._is_sse
            and self._state == _CHUNK_SIZE
            and not self._buf
            and not self._sbuf
            and req.error_class is None
        )

    def _on_data(self, data: bytes, t: int) -> None:
        req = self.req
        if req is None:
            return  # bytes on an idle connection: ignore (a later request would fail cleanly)
        self.got_bytes = True
        if req.first_byte_ns == 0:
            req.first_byte_ns = t
        try:
            if self._is_sse and not self._buf:
                pos = 0
                if self._state == _CHUNK_DATA:
                    # the rest of a chunk a previous read cut: finish it, then back to the fast path
                    rem = self._rem
                    if len(data) < rem + 2 or not data.startswith(b"\r\n", rem):
                        self._feed(data, t)
                        return
                    self._body(data[:rem], t)
                    self._state = _CHUNK_SIZE
                    pos = rem + 2
                if self._state == _CHUNK_SIZE and not self._sbuf:
                    pos = self._fast(data, pos, t, req)
                if pos:
                    if pos == len(data):
                        return
                    data = data[pos:]
            self._feed(data, t)
        except ValueError as exc:  # malformed HTTP framing
            if req.error_class is None:
                req.error_class = "server_error"
                req.error = f"malformed HTTP response: {exc}"
            self._close_after = True
            self._finish()

    @staticmethod
    def _fast(data: bytes, pos: int, t: int, req) -> int:
        """The common case, done without copies: whole chunks from ``pos`` on, each one whole
        single-line ``data:`` event. Returns where it stopped (the rest goes to the full parser)."""
        n = len(data)
        find = data.find
        startswith = data.startswith
        on_event = req.on_event
        while pos < n:
            le = find(b"\r\n", pos, pos + 10)
            if le < 0:
                break
            try:
                size = int(data[pos:le], 16)
            except ValueError:
                break
            start = le + 8  # after "data: "
            end = le + size  # before the closing "\n\n"
            if (
                size < 8
                or end + 4 > n
                or find(b"\n", start, end + 1) != end  # no line end inside: one single-line event
                or not startswith(b"\n\r\n", end + 1)  # (a lone CR is no line end here either:
                or not startswith(b"data: ", le + 2)  # the full parser only folds CRLF)
            ):
                break
            pos = end + 4
            if end - start == 6 and startswith(b"[DONE]", start):
                req.done_seen = True
            else:
                on_event(t, data, start, end)
        return pos

    def _feed(self, data: bytes, t: int) -> None:
        state = self._state
        if state == _HEAD:
            buf = self._buf + data
            he = buf.find(b"\r\n\r\n")
            if he < 0:
                if len(buf) > 65536:
                    raise ValueError("response header larger than 64 KiB")
                self._buf = buf
                return
            self._parse_head(buf[:he])
            data = buf[he + 4 :]
            self._buf = b""
            state = self._state
            if state == _LENGTH and self._rem == 0:
                self._finish()
                return
            if not data:
                return
        if state == _LENGTH:
            n = len(data)
            rem = self._rem
            if n >= rem:
                if rem:
                    self._body(data[:rem], t)
                self._rem = 0
                self._finish()
            else:
                self._body(data, t)
                self._rem = rem - n
            return
        if state == _UNTIL_CLOSE:
            self._body(data, t)
            return
        if state in (_CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER):
            self._chunked(data, t)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        req = self.req
        req.http_status = status
        req.header_ns = perf_counter_ns()
        chunked = False
        length = None
        ctype = b""
        conn_hdr = b""
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"transfer-encoding":
                chunked = b"chunked" in v.lower()
            elif k == b"content-length":
                length = int(v.strip())
            elif k == b"content-type":
                ctype = v.strip().lower()
            elif k == b"connection":
                conn_hdr = v.strip().lower()
        self._close_after = conn_hdr == b"close" or (parts[0] == b"HTTP/1.0" and conn_hdr != b"keep-alive")
        self._is_sse = status == 200 and ctype.startswith(b"text/event-stream")
        if chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._state = _LENGTH
            self._rem = length
        else:
            self._state = _UNTIL_CLOSE
            self._close_after = True

    def _chunked(self, data: bytes, t: int) -> None:
        buf = self._buf + data if self._buf else data
        pos = 0
        n = len(buf)
        state = self._state
        while pos < n:
            if state == _CHUNK_DATA:
                rem = self._rem
                end = pos + rem
                if end <= n:
                    self._body(buf[pos:end], t)
                    pos = end
                    state = _CHUNK_CRLF
                else:
                    self._body(buf[pos:], t)
                    self._rem = rem - (n - pos)
                    pos = n
                continue
            if state == _CHUNK_CRLF:
                if n - pos < 2:
                    break
                pos += 2
                state = _CHUNK_SIZE
                continue
            le = buf.find(b"\r\n", pos)
            if le < 0:
                if n - pos > 4096:
                    raise ValueError("chunk header too long")
                break
            if state == _TRAILER:
                if le == pos:  # empty line: the response is over
                    self._buf = b""
                    self._state = _IDLE
                    self._finish()
                    return
                pos = le + 2
                continue
            size = int(buf[pos:le].split(b";", 1)[0], 16)
            pos = le + 2
            if size == 0:
                state = _TRAILER
            else:
                self._rem = size
                state = _CHUNK_DATA
        self._state = state
        self._buf = buf[pos:] if pos < n else b""

    def _body(self, piece: bytes, t: int) -> None:
        if not self._is_sse:
            self.body_parts.append(piece)
            return
        kept = self._sbuf
        if kept:
            # The kept bytes hold no event end, bar a "\n" or "\n\r" at their very end that this piece
            # may complete: the search resumes there, so a long event read in many pieces (SGLang's
            # cumulative text and ids) is scanned once, not once per piece.
            sbuf = kept + piece
            pos = len(kept) - 2 if len(kept) > 2 else 0
        else:
            sbuf = piece
            pos = 0
        if b"\r" in piece or kept.endswith(b"\r"):
            sbuf = sbuf.replace(b"\r\n", b"\n")
        req = self.req
        find = sbuf.find
        startswith = sbuf.startswith
        start = 0
        while True:
            # An event ends at an empty line. Searching for the one-byte "\n" (memchr) and checking the
            # next byte is ~50x faster than searching for b"\n\n" on a 90 KB event.
            end = find(b"\n", pos)
            if end < 0:
                break
            if not startswith(b"\n", end + 1):
                pos = end + 1
                continue
            bstart = start
            start = pos = end + 2
            if startswith(b"data: ", bstart) and find(b"\n", bstart, end) < 0:
                if end - bstart == 12 and startswith(b"[DONE]", bstart + 6):
                    req.done_seen = True
                else:
                    req.on_event(t, sbuf, bstart + 6, end)
                continue
            block = sbuf[bstart:end]
            datas = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if not datas:
                continue  # comment / event: / id: lines only
            payload = b"\n".join(datas)
            if payload == b"[DONE]":
                req.done_seen = True
                continue
            req.on_event(t, payload, 0, len(payload))
        self._sbuf = sbuf[start:] if start < len(sbuf) else b""

    def _finish(self) -> None:
        req = self.req
        if req is None:
            return
        self.req = None
        self._state = _IDLE
        self._hot = False
        req.end_ns = perf_counter_ns()
        if req.error_class is None:
            if req.http_status != 200:
                body = b"".join(self.body_parts)[:MAX_ERROR_BODY]
                req.error_class = "http_status"
                req.error = f"HTTP {req.http_status}: {body.decode('utf-8', 'replace').strip()}"
            elif not self._is_sse:
                req.on_body(b"".join(self.body_parts), req.end_ns)
            elif self._sbuf.strip():
                # an unterminated last event: still data the server sent
                tail = self._sbuf.strip()
                self._sbuf = b""
                if tail.startswith(b"data:"):
                    p = tail[5:].strip()
                    if p == b"[DONE]":
                        req.done_seen = True
                    else:
                        req.on_event(req.end_ns, p, 0, len(p))
        self.body_parts = []
        keep = not (self._close_after or self.closed or req.error_class in ("timeout", "cancelled"))
        if not keep and not self.closed:
            self._close()
        self.owner.request_done(self, req)


# Linux: SO_TIMESTAMPNS (asm-generic value; the socket module does not export it). The kernel
# stamps each received segment (on loopback: while the sender's write() runs), so the event time
# no longer depends on when this process gets the CPU to read it.
SO_TIMESTAMPNS = 35
# below glibc's mmap threshold: a 256 KiB recvmsg buffer cost ~2 us more per read (mmap per call)
_RECV_SIZE = 65536


def _offset() -> int:
    return time_ns() - perf_counter_ns()


class KConn(Conn):
    """The same HTTP/SSE parser on a plain non-blocking socket read with ``recvmsg``, taking each
    read's time from the kernel receive timestamp (SO_TIMESTAMPNS) instead of the read call."""

    __slots__ = ("_wbuf", "fd", "loop", "sock")
    unstamped_reads = 0  # per process: reads timed at the read because no stamp came with them

    @classmethod
    async def open(cls, owner, loop: asyncio.AbstractEventLoop, host: str, port: int) -> KConn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except BaseException:
            sock.close()
            raise
        c = cls(owner)
        c.sock = sock
        c.fd = sock.fileno()
        c.loop = loop
        c._wbuf = b""
        loop.add_reader(c.fd, c._readable)
        return c

    def _readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(_RECV_SIZE, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not data:
            self._lost(None)
            return
        t = 0
        for lvl, typ, cd in anc:
            if typ == SO_TIMESTAMPNS and lvl == socket.SOL_SOCKET and len(cd) >= 16:
                sec, nsec = _TS.unpack_from(cd)
                t = sec * 1_000_000_000 + nsec - _offset()
        now = perf_counter_ns()
        if t <= 0 or t > now:
            if t <= 0:
                KConn.unstamped_reads += 1  # stamping not switched on yet, or not for TCP here
            t = now
        req = self.req
        if req is not None and t < req.send_ns:
            t = req.send_ns
        self.on_data(data, t)

    def _write(self, data: bytes) -> None:
        if self._wbuf:
            self._wbuf += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._lost(exc)
            return
        if n < len(data):
            self._wbuf = data[n:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self._wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        self._wbuf = self._wbuf[n:]
        if not self._wbuf:
            self.loop.remove_writer(self.fd)

    def _lost(self, exc) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self._wbuf:
            self.loop.remove_writer(self.fd)
            self._wbuf = b""
        self.sock.close()
        self.connection_lost(exc)

    def _close(self) -> None:
        self._lost(None)

    def _abort(self) -> None:
        self._lost(None)
