"""The zero-copy receive path (``Conn._fast`` + bounds-based ``on_event``) against the full parser.

Every way the bytes can arrive must give the same per-request results: several events in one
chunk, one event split over two reads at every byte offset, one byte per read, and a second
response on the same kept-alive connection. Expected values are written out by hand from the
stream, not taken from the parser.
"""

from __future__ import annotations

import json

import pytest
from lg_conn_fakes import FakeOwner as _Owner
from lg_conn_fakes import FakeTransport as _Transport
from lg_conn_fakes import chunk as _chunk

from loadgen.backends import make_req
from loadgen.httpconn import Conn

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"


def _native(ct: int, text: str, last: bool = False, spaced: bool = False) -> bytes:
    meta = {"id": "r1", "prompt_tokens": 7, "completion_tokens": ct, "cached_tokens": 2}
    meta["finish_reason"] = {"type": "length", "length": 5} if last else None
    sep = (", ", ": ") if spaced else (",", ":")
    return b"data: " + json.dumps({"text": text, "meta_info": meta}, separators=sep).encode() + b"\n\n"


def _oai(text: str | None, ct: int | None) -> bytes:
    ev: dict = {"object": "text_completion"}
    ev["choices"] = [] if text is None else [{"index": 0, "text": text, "finish_reason": None}]
    if ct is not None:
        ev["usage"] = {"prompt_tokens": 7, "completion_tokens": ct}
    return b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"


# SGLang native: cumulative text; tokens per event 1, 3 (a multi-token event), 1
NATIVE_EVENTS = [_native(1, "a"), _native(4, "a b c d"), _native(5, "a b c d e", last=True)]
# OpenAI completions with continuous usage; a usage-only tail; then [DONE]
OAI_EVENTS = [_oai(" a", 1), _oai(" b c", 3), _oai(" d", 4), _oai(None, 4)]


def _body(events: list[bytes], per_chunk: int) -> bytes:
    """Events framed ``per_chunk`` to a chunk (several events in one chunk when > 1), then [DONE]."""
    out = b""
    for i in range(0, len(events), per_chunk):
        out += _chunk(b"".join(events[i : i + per_chunk]))
    return out + _chunk(b"data: [DONE]\n\n") + END


def _run(backend: str, pieces: list[bytes], conn: Conn | None = None, owner: _Owner | None = None):
    """Feed ``pieces`` as successive reads (read k arrives at time 1000 + k); return the request."""
    owner = owner or _Owner()
    c = conn or Conn(owner)
    c.transport = _Transport()
    req = make_req(backend, 0, b"", 3, 5)
    c.send(req, b"")
    for k, p in enumerate(pieces):
        c.on_data(p, 1000 + k)
    assert owner.done[-1] is req, "the response must be complete"
    req.seal()
    req.analyse()
    return req, c, owner


NATIVE_WANT = {"event_tokens": [1, 3, 1], "output_tokens": 5, "input_tokens": 7, "cached_tokens": 2}
OAI_WANT = {"event_tokens": [1, 2, 1], "output_tokens": 4, "input_tokens": 7, "cached_tokens": None}


def _check(req, want: dict, times: list[int]) -> None:
    assert req.error_class is None, req.error
    assert req.done_seen
    assert req.tokens_source == "server"
    assert req.ev_times == times
    for k, v in want.items():
        assert getattr(req, k) == v, k


@pytest.mark.parametrize("per_chunk", [1, 2, 3])
@pytest.mark.parametrize(
    ("backend", "events", "want"), [("sglang", NATIVE_EVENTS, NATIVE_WANT), ("vllm", OAI_EVENTS, OAI_WANT)]
)
def test_several_events_per_chunk_and_per_read(backend, events, want, per_chunk):
    req, _, _ = _run(backend, [HEAD + _body(events, per_chunk)])
    _check(req, want, [1000] * len(want["event_tokens"]))


@pytest.mark.parametrize(
    ("backend", "events", "want"), [("sglang", NATIVE_EVENTS, NATIVE_WANT), ("vllm", OAI_EVENTS, OAI_WANT)]
)
@pytest.mark.parametrize("per_chunk", [1, 2])
def test_split_at_every_byte_offset(backend, events, want, per_chunk):
    head_read = HEAD  # the head arrives first; then the body is cut in two at every offset
    body = _body(events, per_chunk)
    # offset of the first byte after each content event's closing "\n\n" inside ``body``
    ends, pos = [], 0
    n_content = len(want["event_tokens"])
    for ev in events[:n_content]:
        pos = body.index(ev, pos) + len(ev)
        ends.append(pos)
    for cut in range(1, len(body)):
        req, _, _ = _run(backend, [head_read, body[:cut], body[cut:]])
        # an event is complete in read 1 (t=1001) iff all its bytes are before the cut
        times = [1001 if e <= cut else 1002 for e in ends]
        _check(req, want, times)


@pytest.mark.parametrize(
    ("backend", "events", "want"), [("sglang", NATIVE_EVENTS, NATIVE_WANT), ("vllm", OAI_EVENTS, OAI_WANT)]
)
def test_one_byte_per_read(backend, events, want):
    data = HEAD + _body(events, 1)
    req, _, _ = _run(backend, [data[i : i + 1] for i in range(len(data))])
    ends, pos = [], 0
    for ev in events[: len(want["event_tokens"])]:
        pos = data.index(ev, pos) + len(ev)
        ends.append(1000 + pos - 1)  # the read that carried the event's last byte
    _check(req, want, ends)


def test_keep_alive_reuse_parses_the_second_response_alike():
    data = HEAD + _body(NATIVE_EVENTS, 1)
    req1, conn, owner = _run("sglang", [data[:150], data[150:]])
    assert not conn.closed and conn.req is None
    # the second response on the same connection, head and every event in one read
    req2, conn2, _ = _run("sglang", [data], conn=conn, owner=owner)
    assert conn2 is conn and conn.served == 2
    cut_times = [1000 if data.index(e) + len(e) <= 150 else 1001 for e in NATIVE_EVENTS]
    assert cut_times[0] == 1001 and cut_times[-1] == 1001  # the cut is inside the first event
    _check(req1, NATIVE_WANT, cut_times)
    _check(req2, NATIVE_WANT, [1000, 1000, 1000])
    assert req1.event_tokens == req2.event_tokens == [1, 3, 1]


def test_native_counts_with_spaced_json_and_unknown_events():
    events = [_native(2, "a b", spaced=True), b'data: {"text": "c"}\n\n', _native(4, "a b c d", last=True)]
    req, _, _ = _run("sglang", [HEAD + _body(events, 1)])
    assert req.error_class is None
    # spaced count (regex fallback) 2; the count-less event is one client-counted token; then 4-2
    assert req.event_tokens == [2, 1, 2]
    assert req.output_tokens == 4 and req.tokens_source == "server"


def test_native_error_event_is_a_server_error():
    events = [_native(1, "a"), b'data: {"error": {"message": "boom"}}\n\n']
    req, _, _ = _run("sglang", [HEAD + _body(events, 1)])
    assert req.error_class == "server_error" and "boom" in req.error


def test_sealed_request_holds_no_receive_buffer():
    data = HEAD + _body(NATIVE_EVENTS, 3)
    owner = _Owner()
    c = Conn(owner)
    c.transport = _Transport()
    req = make_req("sglang", 0, b"", 3, 5)
    c.send(req, b"")
    c.on_data(data, 1)
    req.seal()
    # only the last event's payload is kept (for meta_info), not the whole read
    assert req.last == NATIVE_EVENTS[-1][6:-2]
    req.analyse()
    assert req.output_tokens == 5 and not req.has_raw()


@pytest.mark.parametrize("read_size", [1, 2, 3, 7, 64, 4096])
def test_long_events_over_many_reads_with_crlf_and_multiline_events(read_size):
    """SGLang's default stream repeats the whole text and ids in every event, so one event spans many
    reads. The parser resumes its search where the last read ended: an event end split between reads
    ("\\n" | "\\n", "\\r\\n\\r" | "\\n", a multi-line event's inner line end at a read's last byte) is
    still found, once, in the read that carried its last byte."""
    words = " ".join(f"w{i}" for i in range(400))
    plain = _native(1, words)
    crlf = _native(2, words + " x").replace(b"\n\n", b"\r\n\r\n")
    multi = b"event: message\nid: 3\n" + _native(3, words + " x y").replace(b"data: ", b"data:", 1)
    last = _native(5, words + " x y z q", last=True).replace(b"\n\n", b"\r\n\r\n")
    events = [plain, crlf, multi, last]
    data = HEAD + _body(events, 1)
    reads = [data[i : i + read_size] for i in range(0, len(data), read_size)]
    ends, pos = [], 0
    for ev in events:
        pos = data.index(ev, pos) + len(ev)
        ends.append(1000 + (pos - 1) // read_size)  # the read that carried the event's last byte
    req, _, _ = _run("sglang", reads)
    _check(req, {"event_tokens": [1, 1, 1, 2], "output_tokens": 5, "input_tokens": 7}, ends)
