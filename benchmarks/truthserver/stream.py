"""What each event of a request looks like on the wire, per API, and which tokens it carries.

Every event but the last is one ``%`` format into a per-stream template (the words are one slice of
a prebuilt buffer, ``words.WordText``); the last event, OpenAI's usage chunk and the end of the body
go out in one write. The shapes follow SGLang's native ``/generate`` stream (cumulative ``text``,
``meta_info`` with ``completion_tokens``; ``finish_reason`` and ``e2e_latency`` only on the last
event) and the OpenAI completions / chat chunk format.
"""

from __future__ import annotations

import argparse
import json
from time import perf_counter_ns
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import Conn, Server

END_OF_BODY = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


def json_response(obj: object, status: bytes = b"200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def sse_chunk(payload: bytes) -> bytes:
    """One HTTP chunk holding one SSE event."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Settings:
    """The schedule and shape every request gets (from the command line)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.ttft_ns = round(a.ttft_ms * 1e6)
        self.itl_ns = round(a.itl_ms * 1e6)
        self.tpe = a.tokens_per_event
        self.output_len = a.output_len
        self.default_max_tokens = a.default_max_tokens
        self.model = a.model
        self.model_b = a.model.encode()
        self.slice_ns = round(a.slice_ms * 1e6)


def output_len(api: str, req: dict, s: Settings) -> int:
    if s.output_len:
        return s.output_len
    if api == "generate":
        n = (req.get("sampling_params") or {}).get("max_new_tokens")
    else:
        n = req.get("max_completion_tokens") or req.get("max_tokens")
    try:
        n = int(n) if n is not None else s.default_max_tokens
    except (TypeError, ValueError):
        n = s.default_max_tokens
    return max(1, n)


def prompt_tokens(api: str, req: dict) -> int:
    """Token ids count as given; text counts one token per whitespace-separated word."""
    if api == "chat":
        msgs = req.get("messages") or []
        return sum(len(str(m.get("content", "")).split()) for m in msgs if isinstance(m, dict))
    x = req.get("input_ids") if api == "generate" else req.get("prompt")
    if x is None and api == "generate":
        x = req.get("text")
    if isinstance(x, list):
        return len(x)
    return len(str(x or "").split())


GEN_PRE = b'data: {"text":"'
GEN_MID = (
    b'","output_ids":[],"meta_info":{"id":"%d","finish_reason":%s,"prompt_tokens":%d,'
    b'"weight_version":"default","num_retractions":0,"reasoning_tokens":0,"completion_tokens":'
)
GEN_TAIL = b'%d,"cached_tokens":0}}\n\n\r\n'
OAI_TAIL = b',"logprobs":null,"finish_reason":null}]}\n\n\r\n'
OAI_TAIL_USAGE = (
    b',"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n\r\n'
)


class Stream:
    """One request being answered: what to send, when, and when it was really sent."""

    __slots__ = (
        "api",
        "arrival_ns",
        "backlog",
        "conn",
        "cont_usage",
        "dead",
        "due0",
        "include_usage",
        "itl",
        "j",
        "last_j",
        "make",
        "mid",
        "n",
        "parked",
        "pre",
        "pre_next",
        "pt",
        "rec",
        "rid",
        "sends",
        "streamed",
        "text",
        "tpe",
        "tr",
        "w0",
    )

    def __init__(self, srv: Server, conn: Conn, api: str, req: dict, rec: dict) -> None:
        s = srv.s
        self.conn = conn
        self.tr = conn  # write() and get_write_buffer_size(), as an asyncio transport has
        self.text = srv.text
        self.api = api
        self.rec = rec
        self.rid = rec["rid"]
        self.arrival_ns = rec["arrival_ns"]
        self.n = output_len(api, req, s)
        self.pt = rec["pt"]
        self.tpe = s.tpe
        self.streamed = bool(req.get("stream", False))
        self.last_j = -(-self.n // self.tpe) - 1 if self.streamed else 0
        self.j = 0
        self.itl = s.itl_ns
        self.due0 = self.arrival_ns + s.ttft_ns
        self.w0 = (self.rid * 7919) % len(srv.text.words)
        self.sends: list[int] = []
        self.backlog = 0
        self.dead = False
        self.parked = False
        so = req.get("stream_options")
        so = so if isinstance(so, dict) else {}
        self.include_usage = bool(so.get("include_usage"))
        self.cont_usage = bool(so.get("continuous_usage_stats"))
        created = int(rec["wall"])
        if api == "generate":
            self.pre = self.pre_next = GEN_PRE
            self.mid = GEN_MID % (self.rid, b"null", self.pt)
            self.make = self._generate_event
        else:
            if api == "chat":
                head = (
                    b'data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":%d,"model":"%s",'
                    b'"choices":[{"index":0,"delta":{' % (self.rid, created, s.model_b)
                )
                self.pre = head + b'"role":"assistant","content":"'
                self.pre_next = head + b'"content":"'
                self.mid = b'"}'
            else:
                self.pre = self.pre_next = (
                    b'data: {"id":"cmpl-%d","object":"text_completion","created":%d,"model":"%s",'
                    b'"choices":[{"index":0,"text":"' % (self.rid, created, s.model_b)
                )
                self.mid = b'"'
            self.make = self._openai_event
        rec["n"] = self.n
        rec["tpe"] = self.tpe

    def next_due(self) -> int:
        if not self.streamed:
            return self.due0 + (-(-self.n // self.tpe) - 1) * self.itl
        return self.due0 + self.j * self.itl

    def _generate_event(self, j: int) -> bytes:
        upto = (j + 1) * self.tpe
        words = self.text.span(self.w0, upto)
        tail = GEN_TAIL % upto
        size = len(GEN_PRE) + len(words) + len(self.mid) + len(tail) - 2
        return b"%x\r\n%s%s%s%s" % (size, GEN_PRE, words, self.mid, tail)

    def _openai_event(self, j: int) -> bytes:
        tpe = self.tpe
        if j:
            pre = self.pre_next
            words = self.text.span_after_space(self.w0 + j * tpe, tpe)
        else:
            pre = self.pre
            words = self.text.span(self.w0, tpe)
        if self.cont_usage:
            upto = (j + 1) * tpe
            tail = OAI_TAIL_USAGE % (self.pt, upto, self.pt + upto)
        else:
            tail = OAI_TAIL
        mid = self.mid
        return b"%x\r\n%s%s%s%s" % (len(pre) + len(words) + len(mid) + len(tail) - 2, pre, words, mid, tail)

    def usage(self, k: int) -> bytes:
        return b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (self.pt, k, self.pt + k)

    def last_event(self, srv: Server) -> bytes:
        """The last event, the usage chunk (OpenAI, when asked) and the end of the body, in one write."""
        j = self.last_j
        n = self.n
        if self.api == "generate":
            mid = GEN_MID % (self.rid, b'{"type":"length","length":%d}' % n, self.pt)
            e2e = (perf_counter_ns() - self.arrival_ns) / 1e9
            payload = GEN_PRE + self.text.span(self.w0, n) + mid
            payload += b'%d,"cached_tokens":0,"e2e_latency":%.6f}}\n\n' % (n, e2e)
            return sse_chunk(payload) + END_OF_BODY
        start = self.w0 + j * self.tpe
        if j:
            body = self.pre_next + self.text.span_after_space(start, n - j * self.tpe)
        else:
            body = self.pre + self.text.span(start, n)
        body += self.mid + b',"logprobs":null,"finish_reason":"length"}]'
        if self.cont_usage:
            body += b',"usage":' + self.usage(n)
        out = sse_chunk(body + b"}\n\n")
        if self.include_usage:
            obj = b"chat.completion.chunk" if self.api == "chat" else b"text_completion"
            out += sse_chunk(
                b'data: {"id":"u-%d","object":"%s","created":%d,"model":"%s","choices":[],"usage":%s}\n\n'
                % (self.rid, obj, int(self.rec["wall"]), srv.s.model_b, self.usage(n))
            )
        return out + END_OF_BODY

    def whole_response(self, srv: Server) -> bytes:
        text = self.text.span(self.w0, self.n).decode()
        u = {"prompt_tokens": self.pt, "completion_tokens": self.n, "total_tokens": self.pt + self.n}
        created = int(self.rec["wall"])
        if self.api == "chat":
            msg = {"role": "assistant", "content": text}
            obj = {
                "id": f"chatcmpl-{self.rid}",
                "object": "chat.completion",
                "created": created,
                "model": srv.s.model,
                "choices": [{"index": 0, "message": msg, "finish_reason": "length"}],
                "usage": u,
            }
        elif self.api == "completions":
            obj = {
                "id": f"cmpl-{self.rid}",
                "object": "text_completion",
                "created": created,
                "model": srv.s.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
                "usage": u,
            }
        else:
            meta = {
                "id": str(self.rid),
                "finish_reason": {"type": "length", "length": self.n},
                "prompt_tokens": self.pt,
                "completion_tokens": self.n,
                "cached_tokens": 0,
                "e2e_latency": (perf_counter_ns() - self.arrival_ns) / 1e9,
            }
            obj = {"text": text, "output_ids": [], "meta_info": meta}
        return json_response(obj)

    def emit(self, srv: Server) -> int:
        """Write the next event; return the next event's due time, or -1 when the request is over."""
        j = self.j
        tr = self.tr
        if j < self.last_j:
            data = self.make(j)
            if tr.get_write_buffer_size():
                self.backlog += 1
            self.sends.append(perf_counter_ns())
            tr.write(data)
            j += 1
            self.j = j
            return self.due0 + j * self.itl
        data = self.last_event(srv) if self.streamed else self.whole_response(srv)
        if tr.get_write_buffer_size():
            self.backlog += 1
        self.sends.append(perf_counter_ns())
        tr.write(data)
        srv.finish(self, perf_counter_ns())
        return -1
