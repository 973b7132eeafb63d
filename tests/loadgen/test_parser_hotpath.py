"""The per-read hot path of ``Conn.on_data``: while a stream sits at a chunk boundary of an SSE body
with nothing buffered, a read goes straight to the chunk/event scanner; a read boundary anywhere
else hands the rest to the full parser, and the next aligned read is back on the hot path.

Each test checks what a user of the figures cares about (every event's time is the time of the read
that completed it, token counts, the response ends and the connection is reusable) and that the
hot path really is taken again after a cut (else every read would pay the full parser).
Expected values are written out by hand from the stream.
"""

from __future__ import annotations

import json

import pytest
from lg_conn_fakes import FakeOwner, FakeTransport, chunk

from loadgen.backends import make_req
from loadgen.httpconn import Conn

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DONE = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _ev(ct: int) -> bytes:
    """A native SGLang event whose cumulative completion_tokens is ``ct`` (one chunk)."""
    meta = {"prompt_tokens": 7, "completion_tokens": ct, "cached_tokens": 0, "finish_reason": None}
    body = {"text": " ".join("w" for _ in range(ct)), "meta_info": meta}
    return chunk(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")


def _conn():
    owner = FakeOwner()
    c = Conn(owner)
    c.transport = FakeTransport()
    req = make_req("sglang", 0, b"", 7, 64)
    c.send(req, b"")
    return c, req, owner


def _finish(req, owner):
    assert owner.done and owner.done[-1] is req, "the response must be complete"
    req.seal()
    req.analyse()
    assert req.error_class is None, req.error
    assert req.done_seen


E1, E2, E3 = _ev(1), _ev(2), _ev(4)  # tokens per event: 1, 1, 2
# where a read can cut event 2 (offsets into its chunk), named for what they split
_size_end = E2.index(b"\r\n")
CUTS = {
    "inside the chunk-size line": 1,
    "between the size line's CR and LF": _size_end + 1,
    "inside 'data: '": _size_end + 4,
    "inside the payload": len(E2) // 2,
    "between the two LFs": len(E2) - 3,
    "between the LFs and the chunk CRLF": len(E2) - 2,
    "between the chunk's CR and LF": len(E2) - 1,
}


def test_aligned_reads_stay_on_the_hot_path():
    c, req, owner = _conn()
    c.on_data(HEAD, 100)
    assert c._hot  # headers parsed, at a chunk boundary
    c.on_data(E1, 101)
    assert c._hot
    c.on_data(E2 + E3, 102)  # two events in one read: one time for both
    assert c._hot
    c.on_data(DONE, 103)
    _finish(req, owner)
    assert req.ev_times == [101, 102, 102]
    assert req.event_tokens == [1, 1, 2]
    assert req.output_tokens == 4


@pytest.mark.parametrize("where", list(CUTS))
def test_a_cut_read_goes_to_the_full_parser_and_the_next_aligned_read_is_hot_again(where):
    cut = CUTS[where]
    c, req, owner = _conn()
    c.on_data(HEAD + E1, 100)
    assert c._hot
    c.on_data(E2[:cut], 101)
    assert not c._hot, "bytes of a cut event are buffered: the full parser must see the rest"
    c.on_data(E2[cut:] + E3, 102)  # completes event 2, then a whole event 3 in the same read
    assert c._hot, "back at a chunk boundary with nothing buffered: hot again"
    c.on_data(_ev(5), 103)
    c.on_data(DONE, 104)
    _finish(req, owner)
    # event 2 is dated by the read that brought its closing blank line (the chunk's CRLF after it
    # is framing, not part of the event), never by a read that only started it
    t2 = 101 if cut >= len(E2) - 2 else 102
    assert req.ev_times == [100, t2, 102, 103]
    assert req.event_tokens == [1, 1, 2, 1]


def test_many_events_per_read_on_the_hot_path():
    c, req, owner = _conn()
    c.on_data(HEAD, 100)
    c.on_data(b"".join(_ev(k) for k in range(1, 51)), 200)
    assert c._hot
    c.on_data(DONE, 201)
    _finish(req, owner)
    assert req.ev_times == [200] * 50
    assert req.event_tokens == [1] * 50


def test_response_end_inside_a_hot_read_then_the_connection_is_reused():
    c, req, owner = _conn()
    c.on_data(HEAD + E1, 100)
    assert c._hot
    c.on_data(E2 + E3 + DONE, 101)  # the last events, [DONE] and the terminating chunk at once
    _finish(req, owner)
    assert not c._hot and c.req is None
    assert req.ev_times == [100, 101, 101]
    # the next request on the same kept-alive connection starts cold (headers first)
    req2 = make_req("sglang", 1, b"", 7, 64)
    c.send(req2, b"")
    assert not c._hot
    c.on_data(HEAD[:20], 300)
    assert not c._hot
    c.on_data(HEAD[20:] + E1 + E2, 301)
    assert c._hot
    c.on_data(DONE, 302)
    _finish(req2, owner)
    assert req2.ev_times == [301, 301]
    assert req2.output_tokens == 2


def test_bad_chunk_size_on_the_hot_path_is_a_server_error():
    c, req, owner = _conn()
    c.on_data(HEAD + E1, 100)
    assert c._hot
    c.on_data(b"zz\r\n" + E2, 101)
    assert owner.done and owner.done[-1] is req
    assert req.error_class == "server_error"
    assert "malformed HTTP response" in req.error
    assert not c._hot


def test_multi_line_event_on_the_hot_path_takes_the_full_parser():
    # one event with two data: lines (joined by "\n" per SSE); the scanner must not take it whole
    c, req, owner = _conn()
    c.on_data(HEAD + E1, 100)
    odd = chunk(b'data: {"text":"a b",\ndata: "meta_info":{"completion_tokens":2}}\n\n')
    c.on_data(odd + _ev(3), 101)
    assert c._hot
    c.on_data(DONE, 102)
    _finish(req, owner)
    assert req.ev_times == [100, 101, 101]
    assert req.event_tokens == [1, 1, 1]
