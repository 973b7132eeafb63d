"""HTTP surfaces of SGLang and vLLM on top of the engine: routes, payload validation, SSE formats, errors.

Why: quickmap's client, its Ansible health checks and its metric scrapes are written against the real
engines; every status code, error body and stream chunk here follows docs/engine-surfaces.md.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

from .engine import Engine, Req
from .httpserver import Conn, Request, Response
from .metrics import Exposition
from .tokenizer import Tokenizer

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)

    def loads(b: bytes) -> Any:
        return orjson.loads(b)

except ImportError:  # pragma: no cover - the venv has orjson; plain stdlib also works
    import json

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(b: bytes) -> Any:
        return json.loads(b)


SGLANG_VERSION = "0.5.6"
VLLM_VERSION = "0.11.2"
SGL_SAMPLING_KEYS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "ignore_eos",
    "stop",
    "stop_token_ids",
    "min_new_tokens",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "n",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "stream_interval",
}
DONE = b"data: [DONE]\n\n"
OAI_FIELDS = {
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "echo",
    "user",
    "best_of",
    "logit_bias",
    "suffix",
    "response_format",
    "tools",
    "tool_choice",
    "rid",
    "priority",
    "return_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "chat_template_kwargs",
    "return_cached_tokens_details",
    "parallel_tool_calls",
    "reasoning_effort",
    "add_generation_prompt",
    "continue_final_message",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "separate_reasoning",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class App:
    """Routes for one flavour. `engine.ready` gates health; `dead` fails everything."""

    def __init__(self, engine: Engine, tok: Tokenizer, info: dict[str, Any]) -> None:
        self.e = engine
        self.cfg = engine.cfg
        self.tok = tok
        self.tok_strs = tok._strs
        self.incremental = bool(engine.cfg.raw.get("incremental_streaming_output"))
        self.cache_report = bool(
            engine.cfg.raw.get("enable_cache_report") or engine.cfg.raw.get("enable_prompt_tokens_details")
        )
        self.info = info  # server args + capacity for /server_info
        self.sgl = self.cfg.flavour == "sglang"
        self.served = self.cfg.served_model_name
        self.ctx_len = engine.cap.context_len
        self.vocab = engine.model.vocab
        self.created = int(time.time())
        self.tasks: set[asyncio.Future[None]] = set()
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0") == "1"
        sgl = self.sgl
        r: dict[tuple[str, str], Any] = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/tokenize"): self.tokenize,
            ("POST", "/detokenize"): self.detokenize,
            ("GET", "/version"): self.version,
        }
        if sgl:
            r.update(
                {
                    ("GET", "/health_generate"): self.health,
                    ("POST", "/generate"): self.generate,
                    ("PUT", "/generate"): self.generate,
                    ("GET", "/flush_cache"): self.flush_cache,
                    ("POST", "/flush_cache"): self.flush_cache,
                    ("GET", "/server_info"): self.server_info,
                    ("GET", "/get_server_info"): self.server_info,
                    ("GET", "/model_info"): self.model_info,
                    ("GET", "/get_model_info"): self.model_info,
                }
            )
        else:
            r[("GET", "/load")] = lambda req, conn: Response(200, dumps({"server_load": len(self.e.running)}))
            if self.dev_mode:
                r[("POST", "/reset_prefix_cache")] = self.reset_prefix_cache
                r[("GET", "/server_info")] = self.server_info
        if not sgl or self.cfg.enable_metrics:
            pass
        else:
            del r[("GET", "/metrics")]
        self.routes = r
        self.paths = {p for _, p in r}

    # ---- plumbing -----------------------------------------------------------------------------------
    def dispatch(self, req: Request, conn: Conn) -> None:
        handler = self.routes.get((req.method, req.path))
        if handler is None:
            if req.path in self.paths:
                conn.send(Response(405, b'{"detail":"Method Not Allowed"}'))
            else:
                conn.send(Response(404, b'{"detail":"Not Found"}'))
            return
        try:
            out = handler(req, conn)
        except ApiError as e:
            conn.send(self.error(e))
            return
        except Exception as e:  # never let a request take the server down
            conn.send(self.error(ApiError(500, f"{type(e).__name__}: {e}", "InternalServerError")))
            return
        if isinstance(out, Response):
            conn.send(out)
        elif out is not None:
            task = asyncio.ensure_future(self._finish_async(out, conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _finish_async(self, coro: Any, conn: Conn) -> None:
        try:
            out = await coro
        except ApiError as e:
            out = self.error(e)
        except Exception as e:
            out = self.error(ApiError(500, f"{type(e).__name__}: {e}", "InternalServerError"))
        if isinstance(out, Response):
            conn.send(out)

    def error(self, e: ApiError) -> Response:
        if self.sgl:
            kind = {
                400: "Bad Request",
                404: "Not Found",
                500: "Internal Server Error",
                503: "Service Unavailable",
            }.get(e.status, "Bad Request")
            body = {"object": "error", "message": e.message, "type": kind, "param": None, "code": e.status}
        else:
            body = {"error": {"message": e.message, "type": e.kind, "param": None, "code": e.status}}
        return Response(e.status, dumps(body))

    def body(self, req: Request) -> dict[str, Any]:
        try:
            obj = loads(req.body)
        except ValueError as ex:
            raise ApiError(400, f"JSON decode error: {ex}") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "Input should be a valid dictionary or object to extract fields from")
        return obj

    def _check_alive(self) -> None:
        if self.e.dead:
            raise ApiError(503 if not self.sgl else 500, f"Engine is dead: {self.e.dead}", "EngineDeadError")
        if not self.e.ready:
            raise ApiError(503, "The server is not ready yet.", "ServiceUnavailableError")

    def _check_ids(self, ids: list[Any]) -> list[int]:
        vocab = self.vocab
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise ApiError(400, f"Input token ids must be integers, got {t!r}")
            if not 0 <= t < vocab:
                if self.sgl:
                    raise ApiError(400, f"Input token id {t} is out of vocabulary range [0, {vocab}).")
                raise ApiError(400, f"Token id {t} is out of vocabulary")
        return ids

    def _check_lengths(self, n_in: int, max_new: int) -> None:
        ctx = self.ctx_len
        cap = self.e.capacity
        if n_in == 0:
            raise ApiError(400, "The prompt cannot be empty." if not self.sgl else "Input is empty.")
        if self.sgl:
            max_input = min(ctx - 1, cap - 1)
            if n_in >= ctx:
                raise ApiError(
                    400,
                    f"The input ({n_in} tokens) is longer than the model's context length ({ctx} tokens).",
                )
            if n_in > max_input:
                raise ApiError(
                    400,
                    f"Input length ({n_in} tokens) exceeds the maximum allowed length "
                    f"({max_input} tokens). Use a shorter input or enable --allow-auto-truncate.",
                )
            if n_in + max_new > ctx:
                raise ApiError(
                    400,
                    f"Requested token count exceeds the model's maximum context length of {ctx} "
                    f"tokens. You requested a total of {n_in + max_new} tokens: {n_in} tokens from "
                    f"the input messages and {max_new} tokens for the completion. Please reduce the "
                    "number of tokens in the input messages or the completion to fit within the "
                    "limit.",
                )
        else:
            if n_in >= ctx:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {ctx} tokens. However, your request "
                    f"has {n_in} input tokens. Please reduce the length of the input messages.",
                )
            if n_in + max_new > ctx:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {ctx} tokens. However, you requested "
                    f"{n_in + max_new} tokens ({n_in} in the messages, {max_new} in the completion). "
                    "Please reduce the length of the messages or completion.",
                )
            if n_in + max_new > cap + 16:
                raise ApiError(
                    400,
                    f"The request needs {n_in + max_new} KV-cache tokens but the KV cache holds "
                    f"{cap} tokens.",
                )

    @staticmethod
    def _int(obj: dict[str, Any], key: str, default: int | None, lo: int = 0) -> int | None:
        v = obj.get(key, default)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise ApiError(400, f"{key} must be an integer, got {v!r}")
        if v < lo:
            raise ApiError(400, f"{key} must be at least {lo}, got {v}.")
        return v

    def _temperature(self, obj: dict[str, Any]) -> None:
        t = obj.get("temperature", 1.0)
        if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0):
            raise ApiError(400, f"temperature must be non-negative, got {t}.")

    def _stop_ids(self, obj: dict[str, Any]) -> frozenset[int]:
        ids = obj.get("stop_token_ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ApiError(400, "stop_token_ids must be a list of integers")
        return frozenset(ids)

    # ---- SGLang native -----------------------------------------------------------------------------
    def generate(self, req: Request, conn: Conn) -> Any:
        obj = self.body(req)
        self._check_alive()
        text, ids = obj.get("text"), obj.get("input_ids")
        if (text is None) == (ids is None):
            raise ApiError(400, "Either text, input_ids or input_embeds should be provided.")
        if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            raise ApiError(
                400,
                "enginesim: batched /generate (a list of prompts) is not supported; send one "
                "request per prompt.",
            )
        if text is not None:
            if not isinstance(text, str):
                raise ApiError(400, f"text must be a string, got {type(text).__name__}")
            prompt = self.tok.encode(text)
        else:
            if not isinstance(ids, list):
                raise ApiError(400, f"input_ids must be a list of integers, got {type(ids).__name__}")
            prompt = self._check_ids(ids)
        sp = obj.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise ApiError(400, "sampling_params must be an object")
        unknown = set(sp) - SGL_SAMPLING_KEYS
        if unknown:
            raise ApiError(
                400, f"SamplingParams.__init__() got an unexpected keyword argument '{sorted(unknown)[0]}'"
            )
        max_new = self._int(sp, "max_new_tokens", 128)
        assert max_new is not None
        self._temperature(sp)
        self._check_lengths(len(prompt), max_new)
        rid = str(obj.get("rid") or uuid.uuid4().hex)
        stream = bool(obj.get("stream", False))
        sink = SglSink(self, conn, rid, stream)
        r = Req(rid, prompt, max_new, bool(sp.get("ignore_eos", False)), sink, self._stop_ids(sp))
        return self._submit(r, conn, sink, stream)

    def _submit(self, r: Req, conn: Conn, sink: Any, stream: bool) -> Any:
        conn.on_close = lambda: self.e.abort(r)
        if stream:
            conn.start_stream()
        self.e.submit(r)
        return None

    def meta(self, r: Req, finished: bool) -> dict[str, Any]:
        m: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish_reason if finished else None,
            "prompt_tokens": r.prompt_len,
            "weight_version": "default",
            "num_retractions": r.retractions,
            "reasoning_tokens": 0,
            "completion_tokens": r.out_len,
            "cached_tokens": r.cached_tokens,
            "cached_tokens_details": {"device": r.cached_tokens, "host": 0},
            "dp_rank": None,
        }
        if finished:
            m["e2e_latency"] = r.e2e
            if self.cfg.enable_metrics and r.queue_time is not None:
                m["queue_time"] = r.queue_time
            if self.e.spec and r.verify_ct:
                nd = self.e.n_drafts
                m.update(
                    {
                        "spec_accept_rate": r.accepted / max(r.verify_ct * nd, 1),
                        "spec_accept_length": r.out_len / r.verify_ct,
                        "spec_num_correct_drafts": r.accepted,
                        "spec_num_proposed_drafts": r.verify_ct * nd,
                        "spec_accepted_drafts": r.accepted,
                        "spec_proposed_drafts": r.verify_ct * nd,
                        "spec_verify_ct": r.verify_ct,
                        "spec_correct_drafts_histogram": r.hist,
                        "spec_accept_histogram": r.hist,
                    }
                )
            m["response_sent_to_client_ts"] = time.time()
        return m

    def text_of(self, r: Req, start: int, end: int) -> str:
        if end - start == 1 and r.finish_reason is None:
            return self.tok_strs[r.ctx[start]]
        ids = r.ctx[start:end]
        if r.finish_reason and r.finish_reason.get("type") == "stop" and end == len(r.ctx) and ids:
            ids = ids[:-1]  # the stop/EOS token is not part of the text
        return self.tok.stream_text(ids)

    def flush_cache(self, req: Request, conn: Conn) -> Any:
        body = (
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n"
        )
        try:
            timeout = float(req.query.get("timeout", "0"))
        except ValueError:
            raise ApiError(400, f"timeout must be a number, got {req.query.get('timeout')!r}") from None

        async def wait() -> Response:
            end = time.perf_counter() + timeout
            while not self.e.idle() and time.perf_counter() < end:
                await asyncio.sleep(0.01)
            ok = self.e.flush_cache()
            return Response(200 if ok else 400, body, "text/plain; charset=utf-8")

        if timeout > 0:
            return wait()
        ok = self.e.flush_cache()
        return Response(200 if ok else 400, body, "text/plain; charset=utf-8")

    def server_info(self, req: Request, conn: Conn) -> Response:
        e = self.e
        if self.sgl and req.path == "/get_server_info":
            e.log.sgl(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        st = e.stats
        state = dict(self.info)
        state.update(
            {
                "last_gen_throughput": round(st.last_gen_throughput, 2),
                "memory_usage": {
                    "weight": round(e.cap.weight_bytes / (1 << 30), 2),
                    "kvcache": round(e.cap.kv_bytes / (1 << 30), 2),
                    "token_capacity": e.capacity,
                    "graph": 0.06,
                },
                "effective_max_running_requests_per_dp": e.max_running,
            }
        )
        if e.spec and st.spec_verify:
            state["avg_spec_accept_length"] = st.spec_emitted / st.spec_verify
        out = dict(self.info)
        out.update(
            {
                "status": "ready" if e.ready and not e.dead else "starting" if not e.ready else "dead",
                "max_total_num_tokens": e.capacity,
                "max_req_input_len": min(self.ctx_len - 1, e.capacity - 1),
                "internal_states": [state],
                "version": SGLANG_VERSION if self.sgl else VLLM_VERSION,
                "enginesim": {
                    "sched_lag_ms": e.lag_summary(),
                    "events": st.events,
                    "steps": st.steps,
                    "time_scale": e.scale,
                    "hardware": e.cost.hw.key,
                    "kv_used_tokens": e.used_tokens(),
                    "kv_cache_tokens": e.tree.total if e.tree else 0,
                    "running": len(e.running),
                    "waiting": len(e.waiting),
                    "retracted_requests_total": st.retracted_reqs,
                    "preemptions_total": st.preemptions,
                    "completed": e.completed,
                },
            }
        )
        if not self.sgl:
            out = {"vllm_config": self.info, "enginesim": out["enginesim"]}
        return Response(200, dumps(out))

    def model_info(self, req: Request, conn: Conn) -> Response:
        return Response(
            200,
            dumps(
                {
                    "model_path": self.cfg.model_path,
                    "tokenizer_path": self.cfg.model_path,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                    "weight_version": "default",
                    "has_image_understanding": False,
                    "has_audio_understanding": False,
                    "model_type": self.e.model.architecture.lower(),
                    "architectures": [self.e.model.architecture],
                }
            ),
        )

    # ---- health ---------------------------------------------------------------------------------------
    async def health(self, req: Request, conn: Conn) -> Response:
        e = self.e
        if not e.ready or e.dead:
            return Response(503, b"")
        if not self.sgl:
            return Response(200, b"")
        tic = time.perf_counter()
        sink = HealthSink()
        r = Req(f"HEALTH_CHECK_{time.time()}", [0], 1, True, sink, health=True)
        e.submit(r)
        while time.perf_counter() - tic < self.health_timeout:
            if sink.done or e.dead:
                break
            if not e.hung and e.last_step_wall > tic:  # the scheduler made progress since we asked
                break
            await asyncio.sleep(0.005)
        e.abort(r)
        if sink.done or (not e.hung and not e.dead and e.last_step_wall > tic):
            return Response(200, b"")
        e.log.sgl(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.health_timeout} seconds. tic start time: {tic:.3f}. last_heartbeat time: "
            f"{e.last_step_wall:.3f}"
        )
        return Response(503, b"")

    # ---- OpenAI-compatible ---------------------------------------------------------------------------------
    def models(self, req: Request, conn: Conn) -> Response:
        card = {
            "id": self.served,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang" if self.sgl else "vllm",
            "root": self.cfg.model_path,
            "parent": None,
            "max_model_len": self.ctx_len,
        }
        if not self.sgl:
            card["permission"] = [
                {
                    "id": "modelperm-enginesim",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ]
        return Response(200, dumps({"object": "list", "data": [card]}))

    def _check_model(self, obj: dict[str, Any]) -> None:
        model = obj.get("model")
        if not self.sgl and model is not None and model != self.served:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")

    def _oai_common(
        self, obj: dict[str, Any], prompt: list[int], default_max: int | None
    ) -> tuple[int, bool]:
        n = obj.get("n", 1)
        if n != 1:
            raise ApiError(400, "enginesim supports n=1 only")
        key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
        max_new = self._int(obj, key, default_max, 0 if self.sgl else 1)
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
            raise ApiError(
                400,
                "Either prompt or prompt_embeds must be provided and non-empty."
                if not self.sgl
                else "prompt is required",
            )
        else:
            raise ApiError(
                400,
                "prompt must be a string, a list of token ids, or a one-element list of those; "
                "enginesim does not batch several prompts in one request",
            )
        max_new, stream = self._oai_common(obj, prompt, 16)
        rid = str(obj.get("rid") or "cmpl-" + uuid.uuid4().hex)
        sink = OaiSink(self, conn, rid, stream, chat=False, obj=obj)
        r = Req(rid, prompt, max_new, bool(obj.get("ignore_eos", False)), sink, self._stop_ids(obj))
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
        r = Req(rid, prompt, max_new, bool(obj.get("ignore_eos", False)), sink, self._stop_ids(obj))
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
        return Response(200, dumps({"version": SGLANG_VERSION if self.sgl else VLLM_VERSION}))

    def reset_prefix_cache(self, req: Request, conn: Conn) -> Response:
        self.e.log.vllm("Resetting prefix cache...", src="api_router.py:40")
        if self.e.tree is not None:
            if self.e.idle():
                self.e.tree.reset()
            else:
                self.e.tree.evict(self.e.tree.evictable)
        return Response(200, b"")

    # ---- /metrics ----
    def metrics(self, req: Request, conn: Conn) -> Response:
        return Response(
            200,
            (self._sgl_metrics() if self.sgl else self._vllm_metrics()).encode(),
            "text/plain; version=0.0.4; charset=utf-8",
        )

    def _sgl_metrics(self) -> str:
        e, st = self.e, self.e.stats
        lab = f'engine_type="unified",model_name="{self.served}",pp_rank="0",tp_rank="0"'
        tl = f'model_name="{self.served}"'
        x = Exposition()
        g = "gauge"
        x.metric("sglang:num_running_reqs", g, "The number of running requests.", [(lab, len(e.running))])
        x.metric("sglang:num_used_tokens", g, "The number of used tokens.", [(lab, e.used_tokens())])
        x.metric("sglang:token_usage", g, "The token usage.", [(lab, e.token_usage())])
        x.metric(
            "sglang:gen_throughput",
            g,
            "The generation throughput (token/s).",
            [(lab, st.last_gen_throughput)],
        )
        x.metric(
            "sglang:num_queue_reqs",
            g,
            "The number of requests in the waiting queue.",
            [(lab, len(e.waiting))],
        )
        x.metric("sglang:cache_hit_rate", g, "The prefix cache hit rate.", [(lab, st.cache_hit_rate)])
        x.metric(
            "sglang:max_total_num_tokens",
            g,
            "Maximum total number of tokens in the KV cache pool.",
            [(lab, e.capacity)],
        )
        x.metric(
            "sglang:is_cuda_graph",
            g,
            "Whether the batch is using CUDA graph.",
            [(lab, 1.0 if e.cost.cuda_graph else 0.0)],
        )
        if e.spec:
            acc_len = st.spec_emitted / st.spec_verify if st.spec_verify else 0.0
            rate = st.spec_accepted / max(st.spec_verify * e.n_drafts, 1)
            x.metric(
                "sglang:spec_accept_length",
                g,
                "The average acceptance length of speculative decoding.",
                [(lab, acc_len)],
            )
            x.metric(
                "sglang:spec_accept_rate",
                g,
                "The average acceptance rate of speculative decoding.",
                [(lab, rate)],
            )
        x.metric(
            "sglang:num_retracted_reqs",
            g,
            "The number of retracted requests.",
            [(lab, st.retracted_since_log)],
        )
        c = "counter"
        x.metric(
            "sglang:num_retracted_requests_total",
            c,
            "Total number of retracted requests.",
            [(lab, st.retracted_reqs)],
        )
        x.metric(
            "sglang:num_retracted_input_tokens_total",
            c,
            "Total number of retracted input tokens.",
            [(lab, st.retracted_in)],
        )
        x.metric(
            "sglang:num_retracted_output_tokens_total",
            c,
            "Total number of retracted output tokens.",
            [(lab, st.retracted_out)],
        )
        x.metric(
            "sglang:cuda_graph_passes_total",
            c,
            "Total number of forward passes by CUDA graph mode.",
            [(f'{lab},mode="{k}"', v) for k, v in sorted(st.graph_passes.items())]
            or [(f'{lab},mode="decode_none"', 0)],
        )
        x.metric(
            "sglang:realtime_tokens_total",
            c,
            "Total number of tokens processed, by mode.",
            [(f'{lab},mode="{k}"', v) for k, v in sorted(st.realtime_tokens.items())]
            or [(f'{lab},mode="decode"', 0)],
        )
        x.hist("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", lab, st.queue)
        x.metric(
            "sglang:prompt_tokens_total", c, "Number of prefill tokens processed.", [(tl, st.prompt_tokens)]
        )
        x.metric(
            "sglang:generation_tokens_total",
            c,
            "Number of generation tokens processed.",
            [(tl, st.generation_tokens)],
        )
        x.metric("sglang:cached_tokens_total", c, "Number of cached prompt tokens.", [(tl, st.cached_tokens)])
        x.metric("sglang:num_requests_total", c, "Number of requests processed.", [(tl, st.requests)])
        x.metric("sglang:num_aborted_requests_total", c, "Number of requests aborted.", [(tl, st.aborted)])
        x.hist(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tl, st.ttft
        )
        x.hist(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tl, st.itl
        )
        x.hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            tl,
            st.e2e,
        )
        x.hist("sglang:num_retractions", "Histogram of retractions per request.", tl, st.retractions_hist)
        return x.text()

    def _vllm_metrics(self) -> str:
        e, st = self.e, self.e.stats
        lab = f'engine="0",model_name="{self.served}"'
        x = Exposition()
        g, c = "gauge", "counter"
        x.metric(
            "vllm:num_requests_running",
            g,
            "Number of requests in model execution batches.",
            [(lab, len(e.running))],
        )
        x.metric(
            "vllm:num_requests_waiting",
            g,
            "Number of requests waiting to be processed.",
            [(lab, len(e.waiting))],
        )
        x.metric(
            "vllm:kv_cache_usage_perc",
            g,
            "KV-cache usage. 1 means 100 percent usage.",
            [(lab, e.token_usage())],
        )
        x.metric(
            "vllm:prefix_cache_queries_total",
            c,
            "Prefix cache queries, in terms of number of queried tokens.",
            [(lab, st.prefix_queries)],
        )
        x.metric(
            "vllm:prefix_cache_hits_total",
            c,
            "Prefix cache hits, in terms of number of cached tokens.",
            [(lab, st.prefix_hits)],
        )
        x.metric(
            "vllm:num_preemptions_total",
            c,
            "Cumulative number of preemption from the engine.",
            [(lab, st.preemptions)],
        )
        x.metric(
            "vllm:prompt_tokens_total", c, "Number of prefill tokens processed.", [(lab, st.prompt_tokens)]
        )
        x.metric(
            "vllm:generation_tokens_total",
            c,
            "Number of generation tokens processed.",
            [(lab, st.generation_tokens)],
        )
        reasons = ["stop", "length", "abort"]
        x.metric(
            "vllm:request_success_total",
            c,
            "Count of successfully processed requests.",
            [(f'{lab},finished_reason="{k}"', st.finished_by_reason.get(k, 0)) for k in reasons],
        )
        x.hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            lab,
            st.iter_tokens,
        )
        x.hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, st.ttft
        )
        x.hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, st.itl
        )
        x.hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, st.e2e
        )
        x.hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            lab,
            st.queue,
        )
        x.metric(
            "vllm:cache_config_info",
            g,
            "Information of the LLMEngine CacheConfig",
            [
                (
                    f'{lab},block_size="{self.cfg.page_size}",cache_dtype="{self.cfg.kv_cache_dtype}",'
                    f'enable_prefix_caching="{self.cfg.prefix_cache}",gpu_memory_utilization="{self.cfg.mem_fraction}",'
                    f'num_gpu_blocks="{e.cap.blocks}"',
                    1.0,
                )
            ],
        )
        if e.spec:
            x.metric(
                "vllm:spec_decode_num_drafts_total",
                c,
                "Number of spec decoding drafts.",
                [(lab, st.spec_drafts)],
            )
            x.metric(
                "vllm:spec_decode_num_draft_tokens_total",
                c,
                "Number of draft tokens.",
                [(lab, st.spec_draft_tokens)],
            )
            x.metric(
                "vllm:spec_decode_num_accepted_tokens_total",
                c,
                "Number of accepted tokens.",
                [(lab, st.spec_accepted)],
            )
            x.metric(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                c,
                "Accepted tokens per draft position.",
                [(f'{lab},position="{i}"', st.spec_per_pos.get(i, 0)) for i in range(e.n_drafts)],
            )
        return x.text()


class SglSink:
    """SGLang /generate output: cumulative text + output_ids + meta_info per chunk, or one JSON at the end.

    The cumulative fields are kept JSON-encoded and grown per token, so a chunk costs O(new tokens).
    """

    __slots__ = ("app", "conn", "ids_json", "rid", "rid_b", "sent_text", "stream", "text", "text_json")

    def __init__(self, app: App, conn: Conn, rid: str, stream: bool) -> None:
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

    def __init__(self, app: App, conn: Conn, rid: str, stream: bool, chat: bool, obj: dict[str, Any]) -> None:
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
                if app.sgl:
                    choice["matched_stop"] = (r.finish_reason or {}).get("matched")
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
        if self.continuous or (finished and self.include_usage and app.sgl):
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
