"""The OpenAI-compatible surface both engines serve: /v1/models, /v1/completions, /v1/chat/completions,
/tokenize, /detokenize, /version. What differs per engine (error texts, the model card, the smallest
max_tokens) comes from the flavour.
"""

from __future__ import annotations

import uuid
from typing import Any

from .httpserver import Conn, Request, Response
from .scheduler import Req
from .sinks import OaiSink
from .wire import ApiError, dumps


class OpenAIRoutes:
    """Mixed into api.App."""

    def models(self, req: Request, conn: Conn) -> Response:
        card = {
            "id": self.served,
            "object": "model",
            "created": self.created,
            "owned_by": self.fl.owned_by,
            "root": self.cfg.model_path,
            "parent": None,
            "max_model_len": self.ctx_len,
        }
        card = self.fl.model_card(card, self.created)
        return Response(200, dumps({"object": "list", "data": [card]}))

    def _check_model(self, obj: dict[str, Any]) -> None:
        why = self.fl.check_model(obj.get("model"), self.served)
        if why:
            raise ApiError(404, why, "NotFoundError")

    def _oai_common(
        self, obj: dict[str, Any], prompt: list[int], default_max: int | None
    ) -> tuple[int, bool]:
        n = obj.get("n", 1)
        if n != 1:
            raise ApiError(400, "enginesim supports n=1 only")
        key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
        max_new = self._int(obj, key, default_max, self.fl.min_max_tokens)
        if max_new is None:
            max_new = max(self.ctx_len - len(prompt), 1)
        self._temperature(obj)
        so = obj.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise ApiError(400, "stream_options must be an object")
        if so and not obj.get("stream"):
            raise ApiError(400, "Stream options can only be defined when `stream=True`.")
        self._check_lengths(len(prompt), max_new)
        return max_new, bool(obj.get("stream", False))

    def completions(self, req: Request, conn: Conn) -> Any:
        obj = self.body(req)
        self._check_alive()
        self._check_model(obj)
        p = obj.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]
        if isinstance(p, str):
            prompt = self.tok.encode(p)
        elif isinstance(p, list) and all(isinstance(t, int) for t in p):
            prompt = self._check_ids(p)
        elif p is None:
            raise ApiError(400, self.fl.missing_prompt())
        else:
            raise ApiError(
                400,
                "prompt must be a string, a list of token ids, or a one-element list of those; "
                "enginesim does not batch several prompts in one request",
            )
        max_new, stream = self._oai_common(obj, prompt, 16)
        rid = str(obj.get("rid") or "cmpl-" + uuid.uuid4().hex)
        sink = OaiSink(self, conn, rid, stream, chat=False, obj=obj)
        r = Req(
            rid,
            prompt,
            max_new,
            bool(obj.get("ignore_eos", False)),
            sink,
            self._stop_ids(obj),
            text_prompt=isinstance(p, str),
        )
        return self._submit(r, conn, sink, stream)

    def _chat_prompt(self, obj: dict[str, Any]) -> list[int]:
        msgs = obj.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages must be a non-empty list")
        parts = []
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m:
                raise ApiError(400, "each message must be an object with a role")
            c = m.get("content", "")
            if isinstance(c, list):
                c = "".join(x.get("text", "") for x in c if isinstance(x, dict))
            parts.append(f"<|im_start|>{m['role']}\n{c}<|im_end|>\n")
        parts.append("<|im_start|>assistant\n")
        return self.tok.encode("".join(parts))

    def chat(self, req: Request, conn: Conn) -> Any:
        obj = self.body(req)
        self._check_alive()
        self._check_model(obj)
        prompt = self._chat_prompt(obj)
        max_new, stream = self._oai_common(obj, prompt, None)
        rid = "chatcmpl-" + uuid.uuid4().hex
        sink = OaiSink(self, conn, rid, stream, chat=True, obj=obj)
        r = Req(
            rid,
            prompt,
            max_new,
            bool(obj.get("ignore_eos", False)),
            sink,
            self._stop_ids(obj),
            text_prompt=True,  # chat messages are text: the engine applies the template and tokenises
        )
        return self._submit(r, conn, sink, stream)

    def tokenize(self, req: Request, conn: Conn) -> Response:
        obj = self.body(req)
        if "messages" in obj:
            ids = self._chat_prompt(obj)
        else:
            p = obj.get("prompt", obj.get("text"))
            if not isinstance(p, str):
                raise ApiError(400, "prompt must be a string")
            ids = self.tok.encode(p)
        return Response(
            200, dumps({"count": len(ids), "max_model_len": self.ctx_len, "tokens": ids, "token_strs": None})
        )

    def detokenize(self, req: Request, conn: Conn) -> Response:
        obj = self.body(req)
        ids = obj.get("tokens")
        if not isinstance(ids, list):
            raise ApiError(400, "tokens must be a list of integers")
        return Response(200, dumps({"prompt": self.tok.decode(self._check_ids(ids))}))

    def version(self, req: Request, conn: Conn) -> Response:
        return Response(200, dumps({"version": self.fl.version}))
