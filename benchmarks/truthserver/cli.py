"""truthserver: a streaming LLM endpoint whose every send time is known, to score benchmark clients.

A client's reported TTFT and ITL can only be judged against what the server really did. This server
does nothing but stream words on a fixed schedule and write down, for every request, when it arrived
and when each event was handed to the socket (``perf_counter_ns`` right before the ``write``). The
benchmark (benchmarks/bench_loadgen.py) compares a client's figures with that truth log.

Schedule: a request that has fully arrived at time A gets event j (0-based) due at
A + TTFT + j·ITL (absolute deadlines: a late event does not push the later ones). Each event carries
``--tokens-per-event`` tokens (the last one the rest). Streams that are due together are served round
robin, one event each, like one decode step of a batch; a stream whose connection cannot take more
bytes waits (nothing is buffered without bound), and that wait shows as lateness in the log.

Surfaces (HTTP/1.1 keep-alive, chunked SSE):
  POST /generate                      SGLang native: cumulative ``text`` + ``meta_info`` per event
  POST /v1/completions                OpenAI completions (``stream_options.include_usage`` and
                                      ``continuous_usage_stats`` honoured)
  POST /v1/chat/completions           OpenAI chat
  POST /flush_cache /reset_prefix_cache   accepted, no-op
  GET  /health /health_generate /v1/models /get_model_info /get_server_info /metrics
Non-streamed requests get the whole answer when their last event is due. The output length is
``--output-len`` when given, else the request's max_new_tokens / max_tokens / max_completion_tokens
(``ignore_eos`` is implied: every request runs to its length).

``--procs N`` forks N serving processes on one port (SO_REUSEPORT: the kernel spreads connections),
so the server can use more than one CPU; they share the truth log (whole lines, O_APPEND).

Truth log (``--log``, JSON lines, one per finished or aborted request; fields in README.md).
On SIGINT/SIGTERM the log is flushed and one line ``truthserver: stopped {json}`` gives the totals,
the CPU time of the serving processes and the time they spent sending (``busy_s``).

    python -m benchmarks.truthserver --port 0 --ttft-ms 50 --itl-ms 10 --log truth.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
from time import perf_counter_ns

from .conn import KERNEL_STAMPS, SO_TIMESTAMPNS, Listener
from .server import Server, static_gets
from .stream import Settings

PR_SET_PDEATHSIG = 1


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="truthserver", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (printed on the first line)")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens-per-event", type=int, default=1)
    p.add_argument("--output-len", type=int, default=0, help="tokens per request (0 = as the request asks)")
    p.add_argument("--default-max-tokens", type=int, default=128, help="when the request names no length")
    p.add_argument("--model", default="truthserver-model")
    p.add_argument("--log", required=True, help="truth log (JSON lines, appended)")
    p.add_argument("--procs", type=int, default=1, help="serving processes sharing the port")
    p.add_argument("--slice-ms", type=float, default=2.0, help="longest sending burst before reads run")
    p.add_argument("--no-uvloop", action="store_true")
    return p


def check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse values the schedule cannot honour, naming the flag (exit 2)."""
    if a.ttft_ms < 0 or a.itl_ms < 0:
        p.error(f"--ttft-ms/--itl-ms must be >= 0, got {a.ttft_ms:g}/{a.itl_ms:g}")
    if a.tokens_per_event < 1:
        p.error(f"--tokens-per-event must be >= 1, got {a.tokens_per_event}")
    if a.output_len < 0:
        p.error(f"--output-len must be >= 0, got {a.output_len}")
    if a.default_max_tokens < 1:
        p.error(f"--default-max-tokens must be >= 1, got {a.default_max_tokens}")
    if not 1 <= a.procs <= 64:
        p.error(f"--procs must be in [1, 64], got {a.procs}")
    if not 0 < a.slice_ms <= 1000:
        p.error(f"--slice-ms must be in (0, 1000], got {a.slice_ms:g}")
    if not 0 <= a.port < 65536:
        p.error(f"--port must be in [0, 65535], got {a.port}")


def listen_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """n listening sockets on one port (SO_REUSEPORT); port 0 = the kernel picks one for all."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if KERNEL_STAMPS:  # switched on before any client connects; accepted sockets inherit it
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.bind((host, port))
        port = s.getsockname()[1]
        s.listen(4096)
        s.setblocking(False)
        socks.append(s)
    return socks


async def serve(a: argparse.Namespace, sock: socket.socket, proc: int, report_fd: int) -> None:
    """One serving process: serve until SIGINT/SIGTERM, then write its report to ``report_fd``."""
    loop = asyncio.get_running_loop()
    s = Settings(a)
    srv = Server(s, a.log, proc, a.procs)
    gets = static_gets(s, sock.getsockname()[1])
    listener = Listener(srv, sock, gets)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.call_later(1.0, srv.flush_every_second)
    os.write(report_fd, b"ready\n")
    await stop.wait()
    listener.close()
    os.write(report_fd, json.dumps(srv.close()).encode() + b"\n")


def child(a: argparse.Namespace, sock: socket.socket, proc: int, report_fd: int) -> int:
    """Entry of a forked serving process; it dies with the parent (parent-death signal)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    run = asyncio.run
    if not a.no_uvloop:
        try:
            import uvloop

            run = uvloop.run
        except ImportError:
            pass
    run(serve(a, sock, proc, report_fd))
    return 0


def read_lines(fd: int, n: int, timeout_s: float) -> list[bytes]:
    """n lines from a pipe, or fewer when the timeout passes first."""
    import select

    buf = b""
    deadline = time.monotonic() + timeout_s
    while buf.count(b"\n") < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf.splitlines()


def main(argv: list[str] | None = None) -> int:
    p = make_parser()
    a = p.parse_args(argv)
    check_args(p, a)
    socks = listen_sockets(a.host, a.port, a.procs)
    port = socks[0].getsockname()[1]
    rfd, wfd = os.pipe()
    pids = []
    for k, sock in enumerate(socks):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's exit code is checked by the parent
            os.close(rfd)
            for other in socks:
                if other is not sock:
                    other.close()
            os._exit(child(a, sock, k, wfd))
        pids.append(pid)
    os.close(wfd)
    for sock in socks:
        sock.close()
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    ready = read_lines(rfd, a.procs, 30.0)
    if len(ready) < a.procs:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        print(f"truthserver: only {len(ready)} of {a.procs} serving processes started", file=sys.stderr)
        return 1
    t0 = perf_counter_ns()
    print(
        f"truthserver: listening on http://{a.host}:{port} pid={os.getpid()} procs={a.procs} "
        f"ttft_ms={a.ttft_ms:g} itl_ms={a.itl_ms:g} tokens_per_event={a.tokens_per_event} "
        f"output_len={a.output_len or 'asked'} log={a.log}",
        flush=True,
    )
    while not stop:
        time.sleep(0.2)
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    reports = [json.loads(line) for line in read_lines(rfd, a.procs, 30.0)]
    for pid in pids:
        os.waitpid(pid, 0)
    total: dict = {"procs": a.procs, "wall_s": round((perf_counter_ns() - t0) / 1e9, 3)}
    for r in reports:
        for k, v in r.items():
            total[k] = total.get(k, 0) + v
    total["cpu_s"] = round(total.get("cpu_s", 0.0), 3)
    total["busy_s"] = round(total.get("busy_s", 0.0), 3)
    total["reports"] = len(reports)
    print("truthserver: stopped " + json.dumps(total), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
