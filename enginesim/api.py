"""The HTTP surfaces of the emulated engine: one App per server, its routes chosen by the flavour.

Why: quickmap's client, its Ansible health checks and its metric scrapes are written against the real
engines; every status code, error body and stream chunk follows docs/engine-surfaces.md. Where things
live:

| file | what |
|---|---|
| api.py | App: routing, request bodies, the checks every route shares, /server_info, /health, /metrics |
| routes_openai.py | /v1/models, /v1/completions, /v1/chat/completions, /tokenize, /detokenize, /version |
| routes_native.py | SGLang's /generate, /flush_cache, /model_info, the generating health check |
| routes_sim.py | POST /enginesim/pace (emulator only) |
| sinks.py | the stream formats (SGLang /generate, OpenAI) and the health probe's sink |
| metrics.py | the metric catalogues (sglang:*, vllm:*, enginesim:*) |
| flavours/*.py | what each engine does its own way (error bodies, texts, extra routes, health) |
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from . import flavours
from .engine import Engine, Req
from .httpserver import Conn, Request, Response
from .metrics import sim_exposition
from .routes_native import NativeRoutes
from .routes_openai import OpenAIRoutes
from .routes_sim import SimRoutes
from .tokenizer import Tokenizer
from .wire import ApiError, dumps, loads

__all__ = ["ApiError", "App", "dumps", "loads"]


class App(NativeRoutes, OpenAIRoutes, SimRoutes):
    """Routes for one flavour. `engine.ready` gates health; `dead` fails everything."""

    dumps = staticmethod(dumps)

    def __init__(self, engine: Engine, tok: Tokenizer, info: dict[str, Any]) -> None:
        self.e = engine
        self.cfg = engine.cfg
        self.fl = flavours.get(self.cfg.flavour)
        self.tok = tok
        self.tok_strs = tok._strs
        self.incremental = bool(engine.cfg.raw.get("incremental_streaming_output"))
        self.cache_report = bool(
            engine.cfg.raw.get("enable_cache_report") or engine.cfg.raw.get("enable_prompt_tokens_details")
        )
        self.info = info  # server args + capacity for /server_info
        self.served = self.cfg.served_model_name
        self.ctx_len = engine.cap.context_len
        self.vocab = engine.model.vocab
        self.created = int(time.time())
        self.tasks: set[asyncio.Future[None]] = set()
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0") == "1"
        r: dict[tuple[str, str], Any] = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/tokenize"): self.tokenize,
            ("POST", "/detokenize"): self.detokenize,
            ("GET", "/version"): self.version,
            ("POST", "/enginesim/pace"): self.pace,
        }
        r.update(self.fl.routes(self))
        if not self.fl.serves_metrics(self.cfg):
            del r[("GET", "/metrics")]
        self.routes = r
        self.paths = {p for _, p in r}
        self.replays: dict[tuple[str, ...], dict[str, Any]] = {}

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
        body = self.fl.error_body(e.status, e.message, e.kind)
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
            raise ApiError(self.fl.dead_status, f"Engine is dead: {self.e.dead}", "EngineDeadError")
        if not self.e.ready:
            raise ApiError(503, "The server is not ready yet.", "ServiceUnavailableError")

    def _check_ids(self, ids: list[Any]) -> list[int]:
        vocab = self.vocab
        if not ids or (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab):
            return ids  # the common case at C speed; the loop below names the first bad id
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise ApiError(400, f"Input token ids must be integers, got {t!r}")
            if not 0 <= t < vocab:
                raise ApiError(400, self.fl.bad_id(t, vocab))
        return ids

    def _check_lengths(self, n_in: int, max_new: int) -> None:
        if n_in == 0:
            raise ApiError(400, self.fl.empty_prompt())
        why = self.fl.length_error(n_in, max_new, self.ctx_len, self.e.capacity)
        if why:
            raise ApiError(400, why)

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

    def _submit(self, r: Req, conn: Conn, sink: Any, stream: bool) -> Any:
        conn.on_close = lambda: self.e.abort(r)
        r.host_arrival = conn.arrival
        if stream:
            conn.start_stream()
        self.e.submit_after_intake(r)
        return None

    def text_of(self, r: Req, start: int, end: int) -> str:
        if end - start == 1 and r.finish_reason is None:
            return self.tok_strs[r.ctx[start]]
        ids = r.ctx[start:end]
        if r.finish_reason and r.finish_reason.get("type") == "stop" and end == len(r.ctx) and ids:
            ids = ids[:-1]  # the stop/EOS token is not part of the text
        return self.tok.stream_text(ids)

    # ---- state, health, metrics ---------------------------------------------------------------------
    def server_info(self, req: Request, conn: Conn) -> Response:
        e = self.e
        if req.path == "/get_server_info":  # SGLang only
            e.log.line(
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
                "version": self.fl.version,
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
        out = self.fl.server_info(self.info, out)
        return Response(200, dumps(out))

    async def health(self, req: Request, conn: Conn) -> Response:
        if not self.e.ready or self.e.dead:
            return Response(503, b"")
        return await self.fl.health(self)

    def reset_prefix_cache(self, req: Request, conn: Conn) -> Response:
        self.e.log.line("Resetting prefix cache...", src="api_router.py:40")
        if self.e.tree is not None:
            if self.e.idle():
                self.e.tree.reset()
            else:
                self.e.tree.evict(self.e.tree.evictable)
        return Response(200, b"")

    def metrics(self, req: Request, conn: Conn) -> Response:
        per_rank = getattr(self.e, "exposition", None)  # data-parallel ranks (dp.py)
        text = (
            per_rank(self, self.fl.exposition) if per_rank else self.fl.exposition(self)
        ) + sim_exposition(self)
        return Response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
