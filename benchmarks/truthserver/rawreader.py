"""The cheapest reader of truthserver's streams: what the server can send when the client costs ~nothing.

It keeps C keep-alive connections busy with SGLang-native ``/generate`` requests (closed loop, N in
all) and only drains the sockets: one ``recv_into`` of up to 1 MiB into a reused buffer per wake-up,
no HTTP or SSE parsing, no timestamps; a response is over when its bytes end with the terminating
chunk. If the server sends more tokens per second to this reader than to a benchmark client, the
server was not what limited that client's figure (benchmarks/bench_loadgen.py, client ``raw``).

    python -m benchmarks.truthserver.rawreader --port P [--conc 256] [--num 1024] [--out-len 512]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import time

END = b"0\r\n\r\n"


def request_bytes(port: int, input_len: int, out_len: int) -> bytes:
    body = json.dumps(
        {
            "input_ids": list(range(1000, 1000 + input_len)),
            "sampling_params": {"max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": True},
            "stream": True,
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def run(port: int, conc: int, num: int, out_len: int, input_len: int = 128) -> dict:
    """Send ``num`` requests over ``conc`` connections; return counts and the wall time."""
    req = request_bytes(port, input_len, out_len)
    socks: dict[int, socket.socket] = {}
    tails: dict[int, bytes] = {}
    ep = select.epoll()
    for _ in range(min(conc, num)):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks[s.fileno()] = s
        tails[s.fileno()] = b""
        ep.register(s.fileno(), select.EPOLLIN)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    sent = done = nbytes = reads = 0
    t0 = time.perf_counter()
    for s in socks.values():
        s.sendall(req)
        sent += 1
    while done < num:
        for fd, _ in ep.poll():
            s = socks[fd]
            k = s.recv_into(buf)
            if k == 0:
                raise RuntimeError("the server closed a connection mid-run")
            reads += 1
            nbytes += k
            tail = (tails[fd] + bytes(view[max(0, k - 5) : k]))[-5:]
            if tail == END:
                done += 1
                tail = b""
                if sent < num:
                    s.setblocking(True)
                    s.sendall(req)
                    s.setblocking(False)
                    sent += 1
            tails[fd] = tail
    wall = time.perf_counter() - t0
    for s in socks.values():
        s.close()
    ep.close()
    return {"requests": done, "bytes": nbytes, "reads": reads, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conc", type=int, default=256)
    ap.add_argument("--num", type=int, default=1024)
    ap.add_argument("--out-len", type=int, default=512)
    ap.add_argument("--input-len", type=int, default=128)
    a = ap.parse_args(argv)
    print(json.dumps(run(a.port, a.conc, a.num, a.out_len, a.input_len)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
