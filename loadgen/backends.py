"""Backends: how a request body looks and how a streamed response is read, per server API.

The hot path (``on_event``, called when the bytes of one SSE event arrived) does as little as
possible so the next socket's bytes are stamped on time. It gets the event as bounds into the
received bytes (no copy) and appends the time to a flat ``array('q')`` (no per-event tuple):
OpenAI payloads are only stored (small, constant size); SGLang native events (whose ``text`` is
cumulative, so each grows with the output and parsing each would be O(n^2)) are reduced at once to
their cumulative ``completion_tokens`` by one bounded reverse search and a digit slice, without
copying the payload. ``analyse()`` does the JSON work after the request is over.
"""

from __future__ import annotations

import json
import re
from array import array
from typing import Any

try:  # orjson is ~2x faster; optional so the zipapp needs only the standard library
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - exercised by the zipapp on bare nodes
    _loads = json.loads

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat", "vllm", "vllm-chat")
PATHS = {
    "sglang": "/generate",
    "sglang-oai": "/v1/completions",
    "vllm": "/v1/completions",
    "sglang-oai-chat": "/v1/chat/completions",
    "vllm-chat": "/v1/chat/completions",
}
_CT = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def api_kind(backend: str) -> str:
    """'native' (SGLang /generate), 'cmpl' (/v1/completions) or 'chat' (/v1/chat/completions)."""
    if backend == "sglang":
        return "native"
    return "chat" if backend.endswith("chat") else "cmpl"


def accepts_ids(backend: str) -> bool:
    """Whether the backend takes a token-id prompt (exact input length without a tokenizer)."""
    return api_kind(backend) != "chat"


def build_body(
    backend: str, model: str, text: str | None, ids: list[int] | None, output_len: int, ignore_eos: bool
) -> bytes:
    """The JSON body for one streamed request (temperature 0, fixed output budget)."""
    kind = api_kind(backend)
    if kind == "native":
        body: dict[str, Any] = {"text": text} if ids is None else {"input_ids": ids}
        body["sampling_params"] = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": ignore_eos}
        body["stream"] = True
    else:
        body = {"model": model}
        if kind == "chat":
            body["messages"] = [{"role": "user", "content": text}]
            body["max_completion_tokens"] = output_len
        else:
            body["prompt"] = text if ids is None else ids
            body["max_tokens"] = output_len
        body["temperature"] = 0.0
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body["ignore_eos"] = ignore_eos
    return json.dumps(body, separators=(",", ":")).encode()


class Req:
    """One request's timing state; the per-backend subclasses read the stream."""

    __slots__ = (
        "cached_tokens",
        "conn",
        "dataset_input_len",
        "done_seen",
        "end_ns",
        "enq_ns",
        "error",
        "error_class",
        "ev_times",
        "event_tokens",
        "expected_output",
        "first_byte_ns",
        "full",
        "header_ns",
        "http_status",
        "index",
        "input_tokens",
        "output_tokens",
        "payload",
        "raw_t",
        "retried",
        "sched_ns",
        "send_ns",
        "slot_ns",
        "spec",
        "timer",
        "tokens_source",
    )

    def __init__(self, index: int, payload: bytes, dataset_input_len: int, expected_output: int) -> None:
        self.index = index
        self.payload = payload
        self.dataset_input_len = dataset_input_len
        self.expected_output = expected_output
        self.sched_ns = self.slot_ns = self.send_ns = self.enq_ns = 0
        self.first_byte_ns = self.header_ns = self.end_ns = 0
        self.http_status: int | None = None
        self.error_class: str | None = None
        self.error: str | None = None
        self.done_seen = False
        self.raw_t = array("q")  # perf_counter_ns of each stored (not yet analysed) event
        self.full: tuple[int, bytes] | None = None  # a non-streamed body: (time, bytes)
        self.timer = None
        self.conn = None
        self.retried = False
        # filled by analyse()
        self.ev_times: list[int] = []
        self.event_tokens: list[int] = []
        self.output_tokens = 0
        self.input_tokens = dataset_input_len
        self.tokens_source = "client"
        self.cached_tokens: int | None = None
        self.spec: dict | None = None  # SGLang's speculative-decoding fields (meta_info spec_*)

    def on_event(self, t: int, buf: bytes, start: int, end: int) -> None:  # pragma: no cover
        """One SSE ``data`` payload, ``buf[start:end]``, whose last byte arrived at ``t``."""
        raise NotImplementedError

    def has_raw(self) -> bool:
        """Whether events are stored that ``analyse()`` has not turned into results yet."""
        return bool(self.raw_t) or self.full is not None

    def raw_size(self) -> int:  # pragma: no cover - overridden
        """Approximate bytes held by the stored events (the worker's memory budget)."""
        raise NotImplementedError

    def seal(self) -> None:
        """The response is over: keep only what ``analyse()`` needs (no receive buffers)."""

    def reset_raw(self) -> None:
        """Drop the stored events (a resend starts the stream over)."""
        self.raw_t = array("q")
        self.full = None

    def on_body(self, body: bytes, t: int) -> None:
        """A non-streamed 200 response: one event holding all tokens, at the end of the body."""
        self.full = (t, body)

    def analyse(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _set_error(self, cls: str, msg: str) -> None:
        if self.error_class is None:
            self.error_class = cls
            self.error = msg

    def _full_body(self, body: bytes, t: int) -> None:
        try:
            obj = _loads(body)
        except ValueError:
            self._set_error("server_error", f"malformed JSON body: {body[:200]!r}")
            return
        if not isinstance(obj, dict) or obj.get("error") or obj.get("object") == "error":
            self._set_error("server_error", f"server error: {str(obj)[:300]}")
            return
        usage = obj.get("usage") or obj.get("meta_info") or {}
        n = usage.get("completion_tokens")
        if usage.get("prompt_tokens") is not None:
            self.input_tokens = int(usage["prompt_tokens"])
        if n is not None:
            self.tokens_source = "server"
        else:
            n = self.expected_output
        self.output_tokens = int(n)
        self.ev_times = [t]
        self.event_tokens = [int(n)]

    def _check_nonempty(self) -> None:
        if self.error_class is None and not self.ev_times:
            self._set_error("server_error", "response ended without any output token")


class NativeReq(Req):
    """SGLang ``/generate``: cumulative text; ``meta_info.completion_tokens`` counts tokens."""

    __slots__ = ("last", "last_end", "last_start", "odd", "raw_c")

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.raw_c = array("q")  # cumulative completion_tokens per stored event; -1: see ``odd``
        self.odd: list[bytes] = []  # payloads without a token count (error event, unknown shape)
        self.last = b""  # the last counted event is last[last_start:last_end] (no copy per event)
        self.last_start = self.last_end = 0

    def on_event(self, t: int, buf: bytes, start: int, end: int) -> None:
        i = buf.rfind(b'"completion_tokens":', start, end)
        if i >= 0:  # SGLang's (orjson's) compact form: the digits run up to the next ',' or '}'
            j = i + 20
            k = buf.find(b",", j, end)
            if k < 0:
                k = buf.find(b"}", j, end)
            digits = buf[j:k]
            if k > j and digits.isdigit():
                self.raw_t.append(t)
                self.raw_c.append(int(digits))
                self.last = buf
                self.last_start = start
                self.last_end = end
                return
        i = buf.rfind(b'"completion_tokens"', start, end)
        if i >= 0:  # any other spacing
            m = _CT.match(buf, i, end)
            if m is not None:
                self.raw_t.append(t)
                self.raw_c.append(int(m.group(1)))
                self.last = buf
                self.last_start = start
                self.last_end = end
                return
        self.raw_t.append(t)
        self.raw_c.append(-1)
        self.odd.append(buf[start:end])

    def raw_size(self) -> int:
        return 16 * len(self.raw_t) + len(self.last) + sum(len(p) for p in self.odd)

    def seal(self) -> None:
        if self.last_start or self.last_end != len(self.last):
            self.last = self.last[self.last_start : self.last_end]  # one copy per request
            self.last_start, self.last_end = 0, len(self.last)

    def reset_raw(self) -> None:
        super().reset_raw()
        self.raw_c = array("q")
        self.odd = []
        self.last = b""
        self.last_start = self.last_end = 0

    def analyse(self) -> None:
        if self.full is not None:
            self._full_body(self.full[1], self.full[0])
            self.reset_raw()
            return
        prev = 0
        times, toks = [], []
        odd = iter(self.odd)
        for t, c in zip(self.raw_t, self.raw_c, strict=True):
            if c < 0:
                p = next(odd)
                try:
                    obj = _loads(p)
                except ValueError:
                    self._set_error("server_error", f"malformed SSE data: {p[:200]!r}")
                    break
                if isinstance(obj, dict) and obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    self._set_error("server_error", f"server error event: {str(msg)[:300]}")
                    break
                if isinstance(obj, dict) and obj.get("text"):  # no meta_info counts: one token/event
                    times.append(t)
                    toks.append(1)
                continue
            n = c - prev
            if n > 0:
                times.append(t)
                toks.append(n)
                prev = c
        self.ev_times = times
        self.event_tokens = toks
        self.output_tokens = sum(toks)
        if self.last:
            try:
                meta = _loads(self.last[self.last_start : self.last_end]).get("meta_info") or {}
            except (ValueError, AttributeError):
                meta = {}
            if meta.get("completion_tokens") is not None:
                self.tokens_source = "server"
                self.output_tokens = int(meta["completion_tokens"])
            if meta.get("prompt_tokens") is not None:
                self.input_tokens = int(meta["prompt_tokens"])
            if meta.get("cached_tokens") is not None:
                self.cached_tokens = int(meta["cached_tokens"])
            spec = {k: v for k, v in meta.items() if k.startswith("spec_")}
            if spec:
                self.spec = spec
            fr = meta.get("finish_reason")
            if isinstance(fr, dict) and fr.get("type") == "abort":
                self._set_error("server_error", f"request aborted by server: {fr.get('message', '')}"[:300])
        self.reset_raw()
        self._check_nonempty()


class OAIReq(Req):
    """OpenAI ``/v1/completions`` and ``/v1/chat/completions`` streams (one JSON per event)."""

    __slots__ = ("chat", "raw_p")

    def __init__(self, *a, chat: bool = False) -> None:
        super().__init__(*a)
        self.chat = chat
        self.raw_p: list[bytes] = []  # stored payloads (small and constant-size), decoded later

    def on_event(self, t: int, buf: bytes, start: int, end: int) -> None:
        self.raw_t.append(t)
        self.raw_p.append(buf[start:end])

    def raw_size(self) -> int:
        return 8 * len(self.raw_t) + sum(len(p) for p in self.raw_p)

    def reset_raw(self) -> None:
        super().reset_raw()
        self.raw_p = []

    def analyse(self) -> None:
        if self.full is not None:
            self._full_body(self.full[1], self.full[0])
            self.reset_raw()
            return
        prev_ct = 0
        usage = None
        times, toks = [], []
        chat = self.chat
        for t, p in zip(self.raw_t, self.raw_p, strict=True):
            try:
                obj = _loads(p)
            except ValueError:
                self._set_error("server_error", f"malformed SSE data: {p[:200]!r}")
                break
            if not isinstance(obj, dict):
                self._set_error("server_error", f"malformed SSE data: {p[:200]!r}")
                break
            if obj.get("error") or obj.get("object") == "error":
                err = obj.get("error") or obj
                msg = err.get("message") if isinstance(err, dict) else err
                self._set_error("server_error", f"server error event: {str(msg)[:300]}")
                break
            choices = obj.get("choices") or []
            u = obj.get("usage")
            text = ""
            if choices:
                c = choices[0]
                if chat:
                    d = c.get("delta") or {}
                    text = d.get("content") or d.get("reasoning_content") or d.get("reasoning") or ""
                else:
                    text = c.get("text") or ""
                if c.get("finish_reason") == "abort":
                    self._set_error("server_error", "request aborted by server (finish_reason=abort)")
                    break
            ntok = 0
            if u and u.get("completion_tokens") is not None:
                usage = u
                ct = int(u["completion_tokens"])
                if choices:
                    ntok = ct - prev_ct
                    prev_ct = ct
            elif choices and text:
                ntok = 1
            if choices and (ntok > 0 or text):
                times.append(t)
                toks.append(max(ntok, 0))
        self.ev_times = times
        self.event_tokens = toks
        self.output_tokens = sum(toks)
        if usage is not None:
            self.tokens_source = "server"
            self.output_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.input_tokens = int(usage["prompt_tokens"])
            det = usage.get("prompt_tokens_details") or {}
            if isinstance(det, dict) and det.get("cached_tokens") is not None:
                self.cached_tokens = int(det["cached_tokens"])
        self.reset_raw()
        self._check_nonempty()


def make_req(backend: str, index: int, payload: bytes, input_len: int, output_len: int) -> Req:
    """A fresh request object of the right kind for ``backend``."""
    kind = api_kind(backend)
    if kind == "native":
        return NativeReq(index, payload, input_len, output_len)
    return OAIReq(index, payload, input_len, output_len, chat=kind == "chat")
