"""SGLang's native surface: /generate (cumulative or incremental stream, meta_info), /flush_cache,
/model_info, and the generating health check (/health, /health_generate).

Why apart: only SGLang serves these (flavours/sglang.py installs them); the OpenAI routes both engines
serve are in routes_openai.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from .httpserver import Conn, Request, Response
from .scheduler import Req
from .sinks import HealthSink, SglSink
from .wire import ApiError, dumps

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


def sglang_routes(app: Any) -> dict[tuple[str, str], Any]:
    return {
        ("GET", "/health_generate"): app.health,
        ("POST", "/generate"): app.generate,
        ("PUT", "/generate"): app.generate,
        ("GET", "/flush_cache"): app.flush_cache,
        ("POST", "/flush_cache"): app.flush_cache,
        ("GET", "/server_info"): app.server_info,
        ("GET", "/get_server_info"): app.server_info,
        ("GET", "/model_info"): app.model_info,
        ("GET", "/get_model_info"): app.model_info,
    }


async def health_generate(app: Any) -> Response:
    """A 1-token generation with the progress shortcut: healthy as soon as the scheduler stepped since the
    probe arrived; 503 after SGLANG_HEALTH_CHECK_TIMEOUT (the hang injection shows here)."""
    e = app.e
    tic = time.perf_counter()
    sink = HealthSink()
    r = Req(f"HEALTH_CHECK_{time.time()}", [0], 1, True, sink, health=True)
    e.submit(r)
    while time.perf_counter() - tic < app.health_timeout:
        if sink.done or e.dead:
            break
        if not e.hung and e.last_step_wall > tic:  # the scheduler made progress since we asked
            break
        await asyncio.sleep(0.005)
    e.abort(r)
    if sink.done or (not e.hung and not e.dead and e.last_step_wall > tic):
        return Response(200, b"")
    e.log.line(
        f"Health check failed. Server couldn't get a response from detokenizer for last "
        f"{app.health_timeout} seconds. tic start time: {tic:.3f}. last_heartbeat time: "
        f"{e.last_step_wall:.3f}"
    )
    return Response(503, b"")


class NativeRoutes:
    """Mixed into api.App: the handlers of sglang_routes."""

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
        r = Req(
            rid,
            prompt,
            max_new,
            bool(sp.get("ignore_eos", False)),
            sink,
            self._stop_ids(sp),
            text_prompt=text is not None,
        )
        return self._submit(r, conn, sink, stream)

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
