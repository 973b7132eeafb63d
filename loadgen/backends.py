"""Backends: how a request body looks and how a streamed response is read, per server API.

The hot path (``on_event``, called when the bytes of one SSE event arrived) does as little as
possible so the next socket's bytes are stamped on time: OpenAI events are only stored; SGLang
native events (whose ``text`` is cumulative, so parsing each would be O(n^2)) are reduced at once
to their cumulative ``completion_tokens`` with one reverse search. ``analyse()`` does the JSON work
after the request is over.
"""

from __future__ import annotations

import json
import re
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
        "events",
        "expected_output",
        "first_byte_ns",
        "header_ns",
        "http_status",
        "index",
        "input_tokens",
        "output_tokens",
        "payload",
        "retried",
        "sched_ns",
        "send_ns",
        "slot_ns",
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
        self.events: list = []
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

    def on_event(self, t: int, payload: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_body(self, body: bytes, t: int) -> None:
        """A non-streamed 200 response: one event holding all tokens, at the end of the body."""
        self.events = [(t, b"FULL", body)]

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

    __slots__ = ("last",)

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.last = b""

    def on_event(self, t: int, payload: bytes) -> None:
        i = payload.rfind(b'"completion_tokens"')
        if i >= 0:
            m = _CT.match(payload, i)
            if m is not None:
                self.events.append((t, int(m.group(1))))
                self.last = payload
                return
        self.events.append((t, -1, payload))  # no token count: error event or unknown shape

    def analyse(self) -> None:
        if self.events and len(self.events[0]) == 3 and self.events[0][1] == b"FULL":
            self._full_body(self.events[0][2], self.events[0][0])
            self.events = []
            return
        prev = 0
        times, toks = [], []
        for ev in self.events:
            if ev[1] < 0:
                p = ev[2]
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
                    times.append(ev[0])
                    toks.append(1)
                continue
            n = ev[1] - prev
            if n > 0:
                times.append(ev[0])
                toks.append(n)
                prev = ev[1]
        self.ev_times = times
        self.event_tokens = toks
        self.output_tokens = sum(toks)
        if self.last:
            try:
                meta = _loads(self.last).get("meta_info") or {}
            except (ValueError, AttributeError):
                meta = {}
            if meta.get("completion_tokens") is not None:
                self.tokens_source = "server"
                self.output_tokens = int(meta["completion_tokens"])
            if meta.get("prompt_tokens") is not None:
                self.input_tokens = int(meta["prompt_tokens"])
            if meta.get("cached_tokens") is not None:
                self.cached_tokens = int(meta["cached_tokens"])
            fr = meta.get("finish_reason")
            if isinstance(fr, dict) and fr.get("type") == "abort":
                self._set_error("server_error", f"request aborted by server: {fr.get('message', '')}"[:300])
        self.events = []
        self.last = b""
        self._check_nonempty()


class OAIReq(Req):
    """OpenAI ``/v1/completions`` and ``/v1/chat/completions`` streams (one JSON per event)."""

    __slots__ = ("chat",)

    def __init__(self, *a, chat: bool = False) -> None:
        super().__init__(*a)
        self.chat = chat

    def on_event(self, t: int, payload: bytes) -> None:
        self.events.append((t, payload))

    def analyse(self) -> None:
        if self.events and len(self.events[0]) == 3:
            self._full_body(self.events[0][2], self.events[0][0])
            self.events = []
            return
        prev_ct = 0
        usage = None
        times, toks = [], []
        chat = self.chat
        for t, p in self.events:
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
        self.events = []
        self._check_nonempty()


def make_req(backend: str, index: int, payload: bytes, input_len: int, output_len: int) -> Req:
    """A fresh request object of the right kind for ``backend``."""
    kind = api_kind(backend)
    if kind == "native":
        return NativeReq(index, payload, input_len, output_len)
    return OAIReq(index, payload, input_len, output_len, chat=kind == "chat")
