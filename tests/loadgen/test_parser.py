"""The incremental HTTP/1.1 + chunked + SSE parser: any split of the bytes gives the same events."""

from __future__ import annotations

import json
import random

import pytest
from lg_conn_fakes import FakeOwner as _Owner
from lg_conn_fakes import FakeTransport as _Transport
from lg_conn_fakes import chunk as _chunk

from loadgen.backends import make_req
from loadgen.httpconn import Conn


def _stream(n: int) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b""
    for i in range(n):
        ev = {
            "choices": [{"index": 0, "text": f" w{i}"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": i + 1},
        }
        body += _chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
    # a comment line, a multi-line event split over two chunks, CRLF line endings, then [DONE]
    body += _chunk(b": keep-alive\n\n")
    ev = json.dumps({"choices": [{"index": 0, "text": " last"}], "usage": {"completion_tokens": n + 1}})
    body += _chunk(b"data: " + ev[:10].encode()) + _chunk(b"\ndata: " + ev[10:].encode() + b"\r\n\r\n")
    body += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    return head + body


def _feed(pieces: list[bytes]):
    owner = _Owner()
    c = Conn(owner)
    c.transport = _Transport()
    req = make_req("vllm", 0, b"", 3, 9)
    c.send(req, b"")
    for k, p in enumerate(pieces):
        c.on_data(p, 1000 + k)
    assert owner.done == [req]
    return req


@pytest.mark.parametrize("seed", range(8))
def test_any_split_gives_the_same_events(seed):
    data = _stream(8)
    whole = _feed([data])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), 25))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    split = _feed(pieces)
    assert whole.done_seen and split.done_seen
    assert list(whole.raw_p) == list(split.raw_p)
    whole.analyse()
    split.analyse()
    assert whole.error_class is None and split.error_class is None
    assert whole.output_tokens == split.output_tokens == 9
    assert whole.event_tokens == [1] * 9


def test_each_event_gets_the_time_its_last_byte_arrived():
    data = _stream(3)
    i = data.index(b"w1")  # cut inside the second event
    req = _feed([data[:i], data[i:]])
    req.analyse()
    assert req.ev_times[0] == 1000 and req.ev_times[1] == 1001


def test_non_200_keeps_the_body_as_error():
    body = b'{"error": "overloaded"}'
    resp = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    req = _feed([resp[:20], resp[20:]])
    assert req.error_class == "http_status" and req.http_status == 503 and "overloaded" in req.error
