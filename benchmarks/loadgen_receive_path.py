"""loadgen's receive path alone, no server: CPU ns per event to frame and analyse synthetic streams.

Streams of 512 events shaped like truthserver's (chunked SSE, one token per event) — SGLang native
(cumulative text) and OpenAI completions — and a 4,096-token SGLang stream as SGLang sends it by
default (cumulative ``text`` and ``output_ids``: the last event is ~50 KB, the stream ~100 MB, so
events span many reads) are fed to ``Conn.on_data`` one event per read and in 64 KiB reads, then
``analyse()`` runs; thread CPU time, best of 9, so other jobs on the box do not
inflate it. Run from benchmarks/bench_loadgen.py ``--parse-only`` (this tree, and with ``--base-src
DIR`` another copy of the loadgen package, for an A/B of two versions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PY = sys.executable
HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def _parse_streams() -> dict[str, tuple[str, bytes, int]]:
    """Byte-exact streams like truthserver's (chunked SSE, one token per event): name -> (backend,
    bytes, events)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def chunk(b: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(b), b)

    words = [b"w%dx" % (i % 997) for i in range(512)]
    nat, oai = [head], [head]
    for i in range(512):
        fin = b'{"type":"length","length":512}' if i == 511 else b"null"
        nat.append(
            chunk(
                b'data: {"text":"%s","output_ids":[],"meta_info":{"id":"7","prompt_tokens":128,'
                b'"completion_tokens":%d,"cached_tokens":0,"finish_reason":%s,"e2e_latency":0.123456}}\n\n'
                % (b" ".join(words[: i + 1]), i + 1, fin)
            )
        )
        oai.append(
            chunk(
                b'data: {"id":"cmpl-7","object":"text_completion","created":1,"model":"m",'
                b'"choices":[{"index":0,"text":" %s","logprobs":null,"finish_reason":null}],'
                b'"usage":{"prompt_tokens":128,'
                b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (words[i], i + 1, 129 + i)
            )
        )
    oai.append(
        chunk(
            b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[],'
            b'"usage":{"prompt_tokens":128,"completion_tokens":512,"total_tokens":640}}\n\n'
        )
    )
    tail = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    long_n = 4096
    ids, text, ids_out = [head], b"", b""
    for i in range(long_n):
        text += b" " + words[i % 512]
        ids_out += b"%s%d" % (b"," if i else b"", (i * 7919) % 151000)
        fin = b'{"type":"length","length":%d}' % long_n if i == long_n - 1 else b"null"
        ids.append(
            chunk(
                b'data: {"text":"%s","output_ids":[%s],"meta_info":{"id":"7","finish_reason":%s,'
                b'"prompt_tokens":128,"completion_tokens":%d,"cached_tokens":0}}\n\n'
                % (text, ids_out, fin, i + 1)
            )
        )
    return {
        "sglang": ("sglang", b"".join(nat) + tail, 512),
        "vllm": ("vllm", b"".join(oai) + tail, 512),
        "sglang-ids-4k": ("sglang", b"".join(ids) + tail, long_n),
    }


def parse_worker() -> dict:
    """In a subprocess whose cwd holds the loadgen package to time: CPU ns per event, best of 9."""
    sys.path.insert(0, os.getcwd())
    from time import thread_time_ns  # CPU time: other jobs on the box do not inflate it

    from loadgen.backends import make_req
    from loadgen.httpconn import Conn

    class Owner:
        def request_done(self, conn, req) -> None:
            pass

        def conn_closed(self, conn) -> None:
            pass

    class Tr:
        def write(self, data) -> None:
            pass

        close = abort = write

    out = {}
    for name, (backend, data, nev) in _parse_streams().items():
        head_end = data.index(b"\r\n\r\n") + 4
        events, pos = [], head_end
        while pos < len(data):  # split at chunk boundaries: one event per read
            le = data.index(b"\r\n", pos)
            end = le + 2 + int(data[pos:le], 16) + 2
            events.append(data[pos:end])
            pos = end
        per_read = [data[:head_end], *events]
        big = [data[i : i + 65536] for i in range(0, len(data), 65536)]
        conns_n = 20 if nev <= 512 else 2
        for split, pieces in (("1ev/read", per_read), ("64KiB", big)):
            best_rx = best_an = None
            for _ in range(9):
                reqs, conns = [], []
                for _k in range(conns_n):
                    c = Conn(Owner())
                    c.transport = Tr()
                    r = make_req(backend, 0, b"", 128, nev)
                    c.send(r, b"")
                    reqs.append(r)
                    conns.append(c)
                t0 = thread_time_ns()
                for c in conns:
                    on_data = c.on_data
                    for p in pieces:
                        on_data(p, 1)
                t1 = thread_time_ns()
                for r in reqs:
                    r.analyse()
                t2 = thread_time_ns()
                assert all(r.error_class is None and r.output_tokens == nev for r in reqs), reqs[0].error
                rx, an = (t1 - t0) / (conns_n * nev), (t2 - t1) / (conns_n * nev)
                best_rx = rx if best_rx is None else min(best_rx, rx)
                best_an = an if best_an is None else min(best_an, an)
            out[f"{name} {split}"] = (best_rx, best_an)
    return out


def parse_only(base_src: str | None) -> None:
    """Time the receive path of this tree (and of --base-src) in fresh subprocesses."""
    srcs = [("this", ROOT)] + ([("base", base_src)] if base_src else [])
    res = {}
    for name, src in srcs:
        cp = subprocess.run(
            [PY, HERE, "--parse-worker"],
            cwd=src,
            check=True,
            capture_output=True,
            text=True,
        )
        res[name] = json.loads(cp.stdout.strip().splitlines()[-1])
    print(f"receive path, CPU ns per event (best of 9; load average {os.getloadavg()[0]:.1f})")
    for key in res["this"]:
        line = f"  {key:>22}: this rx {res['this'][key][0]:7.0f} analyse {res['this'][key][1]:7.0f}"
        if "base" in res:
            b = res["base"][key]
            line += (
                f" | base rx {b[0]:7.0f} analyse {b[1]:7.0f} | rx this/base {res['this'][key][0] / b[0]:.2f}"
            )
        print(line)


if __name__ == "__main__":  # the worker, run with the loadgen copy to time as its working directory
    print(json.dumps(parse_worker()))
