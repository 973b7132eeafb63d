"""The router in front of a prefill and a decode instance, emulated with the real ones' command lines.

`python -m enginesim sglang_router <flags>` takes `python -m sglang_router.launch_router`'s PD flags
(`--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --host --port`, sgl-model-gateway
`bindings/python/src/sglang_router/router_args.py`): it sends each request to a prefill and a decode
instance at once, with `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room`, and answers with
the decode side's response. `python -m enginesim vllm_proxy <flags>` takes vLLM's toy proxy's flags
(`--prefiller-host(s) --prefiller-port(s) --decoder-host(s) --decoder-port(s) --host --port`,
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`): the request goes to the prefill side with
`kv_transfer_params.do_remote_decode` and `max_tokens` 1, then to the decode side with the
`kv_transfer_params` the prefill answer carried.

A prefill side that cannot be reached or answers an error fails the request here: SGLang's router
answers 503 with the reason, the vLLM proxy 500 `Internal Server Error` (an unhandled exception in the
FastAPI proxy). Each request leaves one log line (`enginesim router: ...`, the emulator's own wording)
and `GET /enginesim/router_stats` counts them. Round robin over the instances; `--policy` is recorded
only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import signal
import sys
import time
from typing import Any

from .httpclient import HopError, Upstream, fetch, split_url
from .httpserver import Conn, Request, Response, serve
from .wire import dumps, loads

SGL_POLICIES = ["random", "round_robin", "cache_aware", "power_of_two", "manual"]
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port, used when none is given
GEN_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_router.py", allow_abbrev=False)
    a = p.add_argument
    a("--host", default="0.0.0.0")
    a("--port", type=int, default=30000)
    a("--mini-lb", action="store_true")
    a("--pd-disaggregation", action="store_true")
    a("--prefill", nargs="+", action="append", metavar="URL [BOOTSTRAP_PORT]")
    a("--decode", nargs=1, action="append", metavar=("URL",))
    a("--policy", choices=SGL_POLICIES, default="cache_aware")
    a("--prefill-policy", choices=[*SGL_POLICIES, "bucket"])
    a("--decode-policy", choices=SGL_POLICIES)
    a("--prometheus-port", type=int)
    a("--prometheus-host")
    a("--request-timeout-secs", type=int, default=1800)
    a("--worker-startup-timeout-secs", type=int, default=1800)
    a("--log-level")
    a("--log-dir")
    a("--disable-health-check", action="store_true")
    a("--disable-circuit-breaker", action="store_true")
    a("--disable-retries", action="store_true")
    return p


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toy_proxy_server.py", allow_abbrev=False)
    a = p.add_argument
    a("--port", type=int, default=8000)
    a("--host", default="127.0.0.1")
    a("--prefiller-hosts", "--prefiller-host", nargs="+", default=["localhost"])
    a("--prefiller-ports", "--prefiller-port", type=int, nargs="+", default=[8100])
    a("--decoder-hosts", "--decoder-host", nargs="+", default=["localhost"])
    a("--decoder-ports", "--decoder-port", type=int, nargs="+", default=[8200])
    return p


def parse(argv: list[str]) -> dict[str, Any]:
    """`sglang_router ...` or `vllm_proxy ...` -> the router's plan; exits 2 naming a bad value."""
    kind, rest = argv[0], argv[1:]
    if kind == "sglang_router":
        p = sglang_parser()
        ns = p.parse_args(rest)
        if not ns.pd_disaggregation:
            p.error("enginesim emulates the PD router only: --pd-disaggregation is required")
        if not ns.prefill or not ns.decode:
            p.error("--pd-disaggregation needs at least one --prefill URL and one --decode URL")
        prefills = []
        for item in ns.prefill:
            if len(item) > 2:
                p.error(f"argument --prefill: {item!r} must be URL [BOOTSTRAP_PORT]")
            bp = item[1] if len(item) == 2 else "none"
            if bp.lower() == "none":
                port = DEFAULT_BOOTSTRAP_PORT
            elif bp.isdigit() and 0 < int(bp) < 65536:
                port = int(bp)
            else:
                p.error(f"argument --prefill: bootstrap port {bp!r} must be a port number or 'none'")
            prefills.append((*_url(p, "--prefill", item[0]), port))
        decodes = [_url(p, "--decode", d[0]) for d in ns.decode]
        return {
            "kind": kind,
            "host": ns.host,
            "port": ns.port,
            "prefill": prefills,
            "decode": decodes,
            "policy": ns.policy,
        }
    if kind == "vllm_proxy":
        p = vllm_parser()
        ns = p.parse_args(rest)
        if len(ns.prefiller_hosts) != len(ns.prefiller_ports):
            p.error("Number of prefiller hosts must match number of prefiller ports")
        if len(ns.decoder_hosts) != len(ns.decoder_ports):
            p.error("Number of decoder hosts must match number of decoder ports")
        prefills = [(h, pt, 0) for h, pt in zip(ns.prefiller_hosts, ns.prefiller_ports, strict=True)]
        decodes = list(zip(ns.decoder_hosts, ns.decoder_ports, strict=True))
        return {
            "kind": kind,
            "host": ns.host,
            "port": ns.port,
            "prefill": prefills,
            "decode": decodes,
            "policy": "round_robin",
        }
    raise SystemExit(f"python -m enginesim: error: unknown router {kind!r} (sglang_router or vllm_proxy)")


def _url(p: argparse.ArgumentParser, flag: str, url: str) -> tuple[str, int]:
    try:
        return split_url(url)
    except ValueError as e:
        p.error(f"argument {flag}: {e}")
    raise AssertionError("unreachable")


class Router:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.sglang = plan["kind"] == "sglang_router"
        self.prefills = itertools.cycle(plan["prefill"])
        self.decodes = itertools.cycle(plan["decode"])
        self.stats = {"requests": 0, "ok": 0, "prefill_failed": 0, "decode_failed": 0, "status": {}}
        self.tasks: set[asyncio.Future[None]] = set()

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] enginesim router: {msg}", flush=True)

    def dispatch(self, req: Request, conn: Conn) -> None:
        if req.method == "GET" and req.path in ("/health", "/liveness", "/readiness", "/healthcheck"):
            if self.sglang and req.path == "/healthcheck":
                conn.send(Response(404, b'{"detail":"Not Found"}'))
                return
            body: Any = {
                "status": "ok",
                "prefill_instances": len(self.plan["prefill"]),
                "decode_instances": len(self.plan["decode"]),
            }
            conn.send(Response(200, dumps(body)))
            return
        if req.method == "GET" and req.path == "/enginesim/router_stats":
            conn.send(Response(200, dumps(self.stats)))
            return
        if req.method == "POST" and req.path in GEN_PATHS and (self.sglang or req.path != "/generate"):
            task = asyncio.ensure_future(self.forward(req, conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        if req.method == "GET" and self.sglang:  # model card, server info: the decode side answers
            task = asyncio.ensure_future(self.passthrough(req, conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        conn.send(Response(404, b'{"detail":"Not Found"}'))

    async def passthrough(self, req: Request, conn: Conn) -> None:
        host, port = next(self.decodes)
        try:
            status, body = await fetch(host, port, req.method, req.path, timeout=30)
        except HopError as e:
            conn.send(Response(503, dumps({"error": f"decode server unavailable: {e}"})))
            return
        conn.send(Response(status, body))

    async def forward(self, req: Request, conn: Conn) -> None:
        t0 = time.perf_counter()
        self.stats["requests"] += 1
        try:
            obj = loads(req.body)
            assert isinstance(obj, dict)
        except (ValueError, AssertionError):
            conn.send(Response(400, dumps({"error": "request body must be a JSON object"})))
            return
        ph, pp, bp = next(self.prefills)
        dh, dp = next(self.decodes)
        where = f"prefill={ph}:{pp} decode={dh}:{dp}"
        status, outcome = 0, "ok"
        try:
            if self.sglang:
                status, outcome = await self._sglang(req.path, obj, conn, (ph, pp, bp), (dh, dp))
            else:
                status, outcome = await self._vllm(req.path, obj, conn, (ph, pp), (dh, dp))
        finally:
            key = "ok" if outcome == "ok" else outcome.split(":", 1)[0]
            self.stats[key] = self.stats.get(key, 0) + 1
            self.stats["status"][str(status)] = self.stats["status"].get(str(status), 0) + 1
            self.log(
                f"{req.method} {req.path} {where} status={status} outcome={outcome} "
                f"total_ms={(time.perf_counter() - t0) * 1000:.1f}"
            )

    async def _sglang(
        self, path: str, obj: dict[str, Any], conn: Conn, pf: tuple[str, int, int], dc: tuple[str, int]
    ) -> tuple[int, str]:
        room = random.getrandbits(63)
        obj = {**obj, "bootstrap_host": pf[0], "bootstrap_port": pf[2], "bootstrap_room": room}
        payload = dumps(obj)
        prefill = asyncio.ensure_future(fetch(pf[0], pf[1], "POST", path, payload, timeout=1800))
        decode = Upstream(dc[0], dc[1], "POST", path, payload)
        opening = asyncio.ensure_future(decode.open(1800))
        try:
            p_status, p_body = await prefill
        except HopError as e:
            opening.cancel()
            decode.close()
            conn.send(Response(503, dumps({"error": f"prefill server failed: {e}"})))
            return 503, f"prefill_failed: {e}"
        if p_status != 200:
            opening.cancel()
            decode.close()
            conn.send(Response(p_status, p_body))
            return p_status, f"prefill_failed: status {p_status}"
        return await self._relay(decode, opening, conn)

    async def _vllm(
        self, path: str, obj: dict[str, Any], conn: Conn, pf: tuple[str, int], dc: tuple[str, int]
    ) -> tuple[int, str]:
        first = {
            k: v for k, v in obj.items() if k not in ("stream_options", "min_tokens", "min_completion_tokens")
        }
        first.update(
            kv_transfer_params={
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            },
            stream=False,
            max_tokens=1,
        )
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        try:
            p_status, p_body = await fetch(pf[0], pf[1], "POST", path, dumps(first), timeout=1800)
            if p_status != 200:
                raise HopError(f"prefill answered {p_status}: {p_body[:200].decode(errors='replace')}")
            params = loads(p_body).get("kv_transfer_params") or {}
        except (HopError, ValueError) as e:
            conn.send(Response(500, b"Internal Server Error", "text/plain; charset=utf-8"))
            return 500, f"prefill_failed: {e}"
        decode = Upstream(dc[0], dc[1], "POST", path, dumps({**obj, "kv_transfer_params": params}))
        return await self._relay(decode, asyncio.ensure_future(decode.open(1800)), conn)

    async def _relay(self, up: Upstream, opening: asyncio.Future[None], conn: Conn) -> tuple[int, str]:
        conn.on_close = up.close
        try:
            await opening
        except HopError as e:
            conn.send(Response(503, dumps({"error": f"decode server failed: {e}"})))
            return 503, f"decode_failed: {e}"
        ctype = up.headers.get("content-type", "application/json")
        if not up.chunked:
            try:
                body = await up.body()
            except HopError as e:
                conn.send(Response(503, dumps({"error": f"decode server failed: {e}"})))
                return 503, f"decode_failed: {e}"
            conn.send(Response(up.status, body, ctype))
            return up.status, "ok" if up.status == 200 else f"decode_failed: status {up.status}"
        conn.start_stream(up.status, ctype)
        try:
            async for chunk in up.chunks():
                conn.chunk(chunk)
        except HopError as e:
            conn.chunk(b"data: " + dumps({"error": f"decode server failed mid-stream: {e}"}) + b"\n\n")
            conn.end_stream()
            return up.status, f"decode_failed: {e}"
        conn.end_stream()
        return up.status, "ok" if up.status == 200 else f"decode_failed: status {up.status}"


async def _amain(plan: dict[str, Any]) -> int:
    router = Router(plan)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        server = await serve(plan["host"], plan["port"], router.dispatch)
    except OSError as e:
        router.log(f"bind to {plan['host']}:{plan['port']} failed: {e}")
        return 1
    router.log(
        f"{plan['kind']} listening on {plan['host']}:{plan['port']} policy={plan['policy']} "
        f"prefill={plan['prefill']} decode={plan['decode']}"
    )
    await stop.wait()
    router.log("shutting down")
    server.close()
    return 0


def main(argv: list[str]) -> int:
    plan = parse(argv)
    try:
        return asyncio.run(_amain(plan))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
