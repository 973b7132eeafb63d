"""Where a request's output goes: SGLang's /generate format, the OpenAI (chat) completions format, or a
health probe. The scheduler calls `emit` for each step's tokens and once more when the request ends.

Why here: the stream formats are the hot path (one call per token per request), kept apart from the
routes that validate and submit requests.
"""

from __future__ import annotations

import time
from typing import Any

from .httpserver import Conn, Response
from .scheduler import Req
from .wire import DONE, ApiError, dumps


class SglSink:
    """SGLang /generate output: cumulative text + output_ids + meta_info per chunk, or one JSON at the end.

    The cumulative fields are kept JSON-encoded and grown per token, so a chunk costs O(new tokens).
    """

    __slots__ = ("app", "conn", "ids_json", "rid", "rid_b", "sent_text", "stream", "text", "text_json")

    def __init__(self, app: Any, conn: Conn, rid: str, stream: bool) -> None:
        self.app = app
        self.conn = conn
        self.rid = rid
        self.stream = stream
        self.text = ""
        self.text_json = bytearray(b'"')
        self.ids_json = bytearray(b"[")
        self.sent_text = 0
        self.rid_b = dumps(rid)[1:-1]

    def emit(self, r: Req, finished: bool) -> None:
        app = self.app
        end = len(r.ctx)
        start = r.prompt_len + self.sent_text
        piece = app.text_of(r, start, end)
        self.text += piece
        self.sent_text = end - r.prompt_len
        if self.stream and app.incremental:
            ids_new = r.ctx[start:end]
            if not finished:
                meta = app.meta(r, False)
                out = {"text": piece, "output_ids": ids_new, "meta_info": meta}
                self.conn.chunk(b"data: " + dumps(out) + b"\n\n")
                return
            out = {"text": piece, "output_ids": ids_new, "meta_info": app.meta(r, True)}
            self.conn.chunk(b"data: " + dumps(out) + b"\n\n")
            self.conn.chunk(DONE)
            self.conn.end_stream()
            return
        if self.stream and not finished:
            self.text_json += dumps(piece)[1:-1]
            ids = self.ids_json
            for t in r.ctx[start:end]:
                ids += b"%d," % t
            self.conn.chunk(
                b'data: {"text":%b","output_ids":%b],"meta_info":{"id":"%b","finish_reason":null,'
                b'"prompt_tokens":%d,"weight_version":"default","num_retractions":%d,'
                b'"reasoning_tokens":0,"completion_tokens":%d,"cached_tokens":%d,'
                b'"cached_tokens_details":{"device":%d,"host":0},"dp_rank":null}}\n\n'
                % (
                    self.text_json,
                    ids[:-1] if len(ids) > 1 else ids,
                    self.rid_b,
                    r.prompt_len,
                    r.retractions,
                    end - r.prompt_len,
                    r.cached_tokens,
                    r.cached_tokens,
                )
            )
            return
        out = {"text": self.text, "output_ids": r.ctx[r.prompt_len :], "meta_info": app.meta(r, finished)}
        if self.stream:
            self.conn.chunk(b"data: " + dumps(out) + b"\n\n")
            if finished:
                self.conn.chunk(DONE)
                self.conn.end_stream()
        elif finished:
            self.conn.send(Response(200, dumps(out)))

    def fail(self, r: Req, message: str) -> None:
        if self.stream:
            self.conn.chunk(b"data: " + dumps({"error": {"message": message}}) + b"\n\n")
            self.conn.chunk(DONE)
            self.conn.end_stream()
        else:
            self.conn.send(self.app.error(ApiError(500, message, "InternalServerError")))


class OaiSink:
    """OpenAI completions / chat output (SSE deltas, usage chunk with stream_options.include_usage)."""

    __slots__ = (
        "app",
        "chat",
        "conn",
        "continuous",
        "created",
        "include_usage",
        "prefix",
        "rid",
        "sent",
        "started",
        "stream",
        "suffix",
        "text",
    )

    def __init__(self, app: Any, conn: Conn, rid: str, stream: bool, chat: bool, obj: dict[str, Any]) -> None:
        self.app = app
        self.conn = conn
        self.rid = rid
        self.stream = stream
        self.chat = chat
        so = obj.get("stream_options") or {}
        self.include_usage = bool(so.get("include_usage"))
        self.continuous = bool(so.get("continuous_usage_stats"))
        self.created = int(time.time())
        self.sent = 0
        self.started = False
        self.text: list[str] = []
        # pre-encoded event template for the common (non-final) chunk
        head = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": app.served,
        }
        self.prefix = (
            b"data: "
            + dumps(head)[:-1]
            + (b',"choices":[{"index":0,"delta":{"content":' if chat else b',"choices":[{"index":0,"text":')
        )
        self.suffix = (
            b'},"logprobs":null,"finish_reason":null}]}\n\n'
            if chat
            else b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        )

    def _usage(self, r: Req) -> dict[str, Any]:
        u: dict[str, Any] = {
            "prompt_tokens": r.prompt_len,
            "total_tokens": r.prompt_len + r.out_len,
            "completion_tokens": r.out_len,
        }
        # filled only with --enable-cache-report (SGLang) / --enable-prompt-tokens-details (vLLM)
        u["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens} if self.app.cache_report else None
        return u

    def _reason(self, r: Req) -> str:
        fr = r.finish_reason or {}
        return "stop" if fr.get("type") == "stop" else "abort" if fr.get("type") == "abort" else "length"

    def emit(self, r: Req, finished: bool) -> None:
        app = self.app
        end = len(r.ctx)
        delta = app.text_of(r, r.prompt_len + self.sent, end)
        self.sent = end - r.prompt_len
        model = app.served
        if not self.stream:
            self.text.append(delta)
            if finished:
                reason = self._reason(r)
                text = "".join(self.text)
                if self.chat:
                    choice = {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "reasoning_content": None,
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                    body = {
                        "id": self.rid,
                        "object": "chat.completion",
                        "created": self.created,
                        "model": model,
                        "choices": [choice],
                        "usage": self._usage(r),
                    }
                else:
                    choice = {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                    body = {
                        "id": self.rid,
                        "object": "text_completion",
                        "created": self.created,
                        "model": model,
                        "choices": [choice],
                        "usage": self._usage(r),
                    }
                app.fl.choice_extras(choice, r)
                self.conn.send(Response(200, dumps(body)))
            return
        conn = self.conn
        if not finished and not self.continuous and (self.started or not self.chat):
            conn.chunk(self.prefix + dumps(delta) + self.suffix)
            return
        reason = self._reason(r) if finished else None
        if self.chat:
            obj_name = "chat.completion.chunk"
            if not self.started:
                self.started = True
                first = {
                    "id": self.rid,
                    "object": obj_name,
                    "created": self.created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                conn.chunk(b"data: " + dumps(first) + b"\n\n")
            choice = {"index": 0, "delta": {"content": delta}, "logprobs": None, "finish_reason": reason}
        else:
            obj_name = "text_completion"
            choice = {
                "index": 0,
                "text": delta,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        chunk: dict[str, Any] = {
            "id": self.rid,
            "object": obj_name,
            "created": self.created,
            "model": model,
            "choices": [choice],
        }
        if self.continuous or (finished and self.include_usage and app.fl.usage_in_last_chunk()):
            chunk["usage"] = self._usage(r)
        conn.chunk(b"data: " + dumps(chunk) + b"\n\n")
        if finished:
            if self.include_usage:
                last = {
                    "id": self.rid,
                    "object": obj_name,
                    "created": self.created,
                    "model": model,
                    "choices": [],
                    "usage": self._usage(r),
                }
                conn.chunk(b"data: " + dumps(last) + b"\n\n")
            conn.chunk(DONE)
            conn.end_stream()

    def fail(self, r: Req, message: str) -> None:
        err = self.app.error(ApiError(500, message, "InternalServerError"))
        if self.stream:
            self.conn.chunk(b"data: " + err.body + b"\n\n")
            self.conn.chunk(DONE)
            self.conn.end_stream()
        else:
            self.conn.send(err)


class HealthSink:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def emit(self, r: Req, finished: bool) -> None:
        if finished:
            self.done = True

    def fail(self, r: Req, message: str) -> None:
        self.done = False
