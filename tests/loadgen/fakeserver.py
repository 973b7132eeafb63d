"""A tiny streaming server for loadgen's tests: exact timing and fault injection.

Runs an asyncio loop in a background thread on 127.0.0.1 (free port). It speaks SGLang's native
/generate (cumulative text + meta_info), /v1/completions, /v1/chat/completions (SSE, chunked),
/v1/models, /metrics, /flush_cache, /reset_prefix_cache and /tokenize (whitespace words), and
records every request it received (path, JSON body, arrival time).

Modes (per server): ok, http500, cut (close after ``cut_after`` events), malformed (one broken
SSE line), error_event (SSE error object), no_first_token (headers, then silence), close_early
(close before any byte), drop_reused (close, unanswered, every request after the first on a
connection: a keep-alive timeout racing the client). ``fail_every=k`` applies the mode to every
k-th request only (1 = all).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time


class FakeServer:
    def __init__(
        self,
        mode: str = "ok",
        ttft: float = 0.005,
        itl: float = 0.002,
        tokens_per_event: int = 1,
        fail_every: int = 1,
        cut_after: int = 2,
        flush_busy: int = 0,
        model: str = "fake-model",
    ) -> None:
        self.mode = mode
        self.ttft = ttft
        self.itl = itl
        self.tpe = tokens_per_event
        self.fail_every = fail_every
        self.cut_after = cut_after
        self.flush_busy = flush_busy
        self.model = model
        self.requests: list[dict] = []
        self.flush_calls = 0
        self.dropped = 0
        self.counter = 0
        self.metrics = {
            "sglang:num_requests_total": 0,
            "sglang:generation_tokens_total": 0,
            "sglang:cached_tokens_total": 0,
        }
        self.active = 0
        self.max_active = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> FakeServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc) -> None:
        loop = self._loop
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=2048)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()

    # -- HTTP --------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        on_conn = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                on_conn += 1
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                hdrs = {}
                for ln in lines[1:]:
                    k, _, v = ln.partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(hdrs.get("content-length", "0") or 0))
                keep = await self._dispatch(method, target.split("?")[0], body, writer, on_conn)
                if not keep:
                    break
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            writer.close()

    @staticmethod
    def _json(writer, obj, status: str = "200 OK") -> None:
        b = json.dumps(obj).encode()
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n"
        writer.write(head.encode() + b)

    async def _dispatch(self, method: str, path: str, body: bytes, writer, on_conn: int = 1) -> bool:
        if path == "/v1/models":
            self._json(writer, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
            return True
        if path == "/metrics":
            text = "".join(
                f"# TYPE {k[:-6] if k.endswith('_total') else k} counter\n"
                f'{k}{{model_name="{self.model}",tp_rank="0"}} {v}\n'
                for k, v in self.metrics.items()
            )
            b = text.encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b)
            )
            return True
        if path in ("/flush_cache", "/reset_prefix_cache"):
            self.flush_calls += 1
            if self.flush_calls <= self.flush_busy:
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 12\r\n\r\nnot flushed\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\nCache flushed\n")
            return True
        if path == "/tokenize":
            obj = json.loads(body)
            n = len(obj.get("prompt", "").split())
            self._json(writer, {"tokens": list(range(n)), "count": n})
            return True
        if path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            self._json(writer, {"error": "not found"}, "404 Not Found")
            return True
        req = json.loads(body)
        if self.mode == "drop_reused" and on_conn > 1:
            self.dropped += 1
            return False  # like a keep-alive timeout racing the client's next request
        arrival = time.perf_counter()
        self.requests.append({"path": path, "body": req, "t": arrival})
        k = self.counter
        self.counter += 1
        faulty = self.mode != "ok" and (k % self.fail_every == 0)
        mode = self.mode if faulty else "ok"
        if mode == "http500":
            self._json(writer, {"error": "boom"}, "500 Internal Server Error")
            return True
        if mode == "close_early":
            return False
        if path == "/generate":
            n = req["sampling_params"]["max_new_tokens"]
            pt = len(req["input_ids"]) if "input_ids" in req else len(req["text"].split())
        else:
            n = req.get("max_tokens") or req.get("max_completion_tokens")
            if path == "/v1/chat/completions":
                pt = len(req["messages"][0]["content"].split())
            else:
                p = req["prompt"]
                pt = len(p) if isinstance(p, list) else len(p.split())
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            return await self._stream(writer, path, req, n, pt, mode, arrival)
        finally:
            self.active -= 1

    async def _stream(self, writer, path, req, n, pt, mode, arrival) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        if mode == "no_first_token":
            await asyncio.sleep(3600)
            return False

        def chunk(b: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(b), b)

        sent = 0
        i = 0
        words: list[str] = []
        while sent < n:
            due = arrival + self.ttft + i * self.itl
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if mode == "cut" and i >= self.cut_after:
                writer.transport.abort()
                return False
            k = min(self.tpe, n - sent)
            new = [f"w{sent + j}" for j in range(k)]
            words += new
            sent += k
            last = sent >= n
            if mode == "malformed" and i == 1:
                data = b'{"choices": [ {"text": broken'
            elif mode == "error_event" and i == 1:
                data = json.dumps({"error": {"message": "engine exploded"}}).encode()
            elif path == "/generate":
                data = json.dumps(
                    {
                        "text": " ".join(words),
                        "meta_info": {
                            "prompt_tokens": pt,
                            "completion_tokens": sent,
                            "cached_tokens": 0,
                            "finish_reason": {"type": "length", "length": n} if last else None,
                        },
                    }
                ).encode()
            else:
                text = (" " if i else "") + " ".join(new)
                if path == "/v1/chat/completions":
                    ch = {"index": 0, "delta": {"content": text}, "finish_reason": "length" if last else None}
                else:
                    ch = {"index": 0, "text": text, "finish_reason": "length" if last else None}
                obj = {"choices": [ch], "usage": {"prompt_tokens": pt, "completion_tokens": sent}}
                data = json.dumps(obj).encode()
            writer.write(chunk(b"data: " + data + b"\n\n"))
            i += 1
        if path != "/generate":
            u = {
                "choices": [],
                "usage": {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n},
            }
            writer.write(chunk(b"data: " + json.dumps(u).encode() + b"\n\n"))
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        self.metrics["sglang:num_requests_total"] += 1
        self.metrics["sglang:generation_tokens_total"] += n
        return True
