"""Prefill/decode disaggregation as both engines spell it, emulated: the roles, the bootstrap handshake,
a KV transfer priced as a fixed part plus bytes over the link, and what a request sees when the prefill
side dies.

Roles. SGLang: `--disaggregation-mode prefill|decode`; the router sends the same request to both sides
with `bootstrap_host`, `bootstrap_port`, `bootstrap_room`; the prefill side serves its rooms on
`--disaggregation-bootstrap-port`. vLLM: `--kv-transfer-config '{"kv_connector":..,"kv_role":..}'`;
the proxy sends the request to the prefill side with `kv_transfer_params.do_remote_decode` and
`max_tokens` 1, takes the `kv_transfer_params` of its answer and sends the request with them to the
decode side (`do_remote_prefill`). `kv_both` serves either part, as the request's params say.

Emulation. A producer request runs on the prefill engine with one new token; when it finishes its room
is ready: bytes = prompt tokens x the model's KV bytes per token (this server's KV dtype and TP), transfer
time = fixed + bytes / link bandwidth (emulated seconds, `--sim-kv-link-gbps`,
`--sim-kv-transfer-fixed-ms`). A consumer request first asks the prefill side for its room (an HTTP long
poll on the bootstrap address: the handshake), then waits the transfer time (x the time scale), puts the
prompt's KV into its pool (the radix tree) and only then enters its scheduler, which computes the last
prompt position and decodes. A prefill side that is unreachable or dies while a room is open fails the
request on the decode side: 500 with the reason, counted as a bootstrap or transfer failure. The log
lines and `enginesim:kv_*` names are the emulator's own wording, not the engines'.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from . import httpclient
from .httpserver import Conn, Request, Response, serve
from .metrics import Exposition
from .scheduler import Req
from .wire import ApiError, dumps, loads

GEN_ROUTES = (("POST", "/generate"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"))
ROOM_PATH = "/enginesim/kv_room"
DEFAULT_LINK_GBPS = 25.0  # GB/s: one 200 Gb/s InfiniBand HCA, an assumption until a rig measures it
DEFAULT_FIXED_MS = 2.0  # handshake + registration per transfer, an assumption (no measurement here)
ROOM_WAIT_S = 600.0  # a decode request waits this long for its room before it fails
ROOM_TTL_S = 600.0  # an unclaimed ready room is dropped after this long


def role_of(raw: dict[str, Any]) -> str | None:
    """`prefill`, `decode`, `both` or None (not disaggregated) from the parsed flags."""
    mode = raw.get("disaggregation_mode")
    if mode in ("prefill", "decode"):
        return str(mode)
    kv = raw.get("kv_transfer_config")
    if isinstance(kv, dict) and kv.get("kv_connector"):
        return {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}[kv["kv_role"]]
    return None


@dataclass
class Link:
    fixed_s: float
    bytes_per_s: float

    def transfer_s(self, nbytes: float) -> float:
        return self.fixed_s + nbytes / self.bytes_per_s


def link_of(raw: dict[str, Any], env: dict[str, str]) -> Link:
    """The emulated link: --sim-kv-link-gbps / ENGINESIM_KV_LINK_GBPS (GB/s), --sim-kv-transfer-fixed-ms
    / ENGINESIM_KV_TRANSFER_FIXED_MS. A bad value stops the start naming it."""

    def pick(flag: str, env_name: str, default: float, positive: bool) -> float:
        v = raw.get(flag)
        src = "--" + flag.replace("_", "-")
        if v is None and env.get(env_name, "") != "":
            v, src = env[env_name], env_name
        if v is None:
            return default
        try:
            x = float(v)
        except ValueError:
            raise SystemExit(f"enginesim: {src}={v!r}: must be a number") from None
        if x != x or x in (float("inf"), float("-inf")) or x < 0 or (positive and x == 0):
            raise SystemExit(
                f"enginesim: {src}={v!r}: must be a finite number {'> 0' if positive else '>= 0'}"
            )
        return x

    gbps = pick("sim_kv_link_gbps", "ENGINESIM_KV_LINK_GBPS", DEFAULT_LINK_GBPS, True)
    fixed = pick("sim_kv_transfer_fixed_ms", "ENGINESIM_KV_TRANSFER_FIXED_MS", DEFAULT_FIXED_MS, False)
    return Link(fixed / 1000.0, gbps * 1e9)


@dataclass
class Room:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    status: str = "open"  # open -> ready | failed
    tokens: int = 0
    nbytes: float = 0.0
    transfer_s: float = 0.0
    reason: str = ""
    opened: float = field(default_factory=time.monotonic)


@dataclass
class Counters:
    transfers_ok: int = 0
    transfer_failed: int = 0
    bootstrap_failed: int = 0
    bytes_total: float = 0.0
    transfer_seconds_total: float = 0.0
    last_latency_ms: float = 0.0
    last_speed_gb_s: float = 0.0
    last_mb: float = 0.0
    last_bootstrap_ms: float = 0.0
    rooms_produced: int = 0


class Disagg:
    """One server's disaggregation role; installs itself on the App (routes, `_submit`, /metrics)."""

    def __init__(self, app: Any, role: str, link: Link, log: Any) -> None:
        self.app, self.e, self.role, self.link, self.log = app, app.e, role, link, log
        self.flavour = app.cfg.flavour
        self.rooms: dict[str, Room] = {}
        self.c = Counters()
        self.pending: dict[str, Any] | None = None
        self.prefill_inflight = 0  # producer requests inside the prefill engine
        self.decode_bootstrap = 0  # consumer requests waiting for their room (handshake)
        self.decode_transfer = 0  # consumer requests whose KV is on the wire
        self.tasks: set[asyncio.Future[None]] = set()
        self.plain_submit = app._submit
        app._submit = self.submit
        for key in GEN_ROUTES:
            if key in app.routes:
                app.routes[key] = self._wrap(app.routes[key])
        app.routes[("GET", ROOM_PATH)] = self.room_route
        app.paths.add(ROOM_PATH)
        if ("GET", "/metrics") in app.routes:
            app.routes[("GET", "/metrics")] = self._metrics(app.routes[("GET", "/metrics")])

    # ---- request parameters ---------------------------------------------------------------------
    def _wrap(self, handler: Any) -> Any:
        def route(req: Request, conn: Conn) -> Any:
            try:
                obj = loads(req.body)
            except ValueError:
                obj = None  # the handler names the bad body
            self.pending = self.params(obj) if isinstance(obj, dict) else None
            try:
                return handler(req, conn)
            finally:
                self.pending = None

        return route

    def params(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """{'produce': room} or {'consume': room, 'host', 'port'} from the request body, or None."""
        if "bootstrap_room" in obj and obj["bootstrap_room"] is not None:
            room, host, port = obj["bootstrap_room"], obj.get("bootstrap_host"), obj.get("bootstrap_port")
            if not isinstance(room, int) or isinstance(room, bool) or room < 0:
                raise ApiError(400, f"bootstrap_room must be a non-negative integer, got {room!r}")
            if self.role == "prefill":
                return {"produce": str(room)}
            if not isinstance(host, str) or not host or not isinstance(port, int) or not 0 < port < 65536:
                raise ApiError(
                    400, f"bootstrap_host/bootstrap_port must name the prefill side, got {host!r}:{port!r}"
                )
            return {"consume": str(room), "host": host, "port": port}
        kv = obj.get("kv_transfer_params")
        if not isinstance(kv, dict):
            return None
        if kv.get("do_remote_decode"):
            return {"produce": None}
        if kv.get("do_remote_prefill"):
            room, host, port = kv.get("remote_request_id"), kv.get("remote_host"), kv.get("remote_port")
            if not isinstance(room, str) or not isinstance(host, str) or not isinstance(port, int):
                raise ApiError(400, f"kv_transfer_params must carry remote_request_id/host/port, got {kv!r}")
            return {"consume": room, "host": host, "port": port}
        return None

    # ---- the two sides --------------------------------------------------------------------------
    def submit(self, r: Req, conn: Conn, sink: Any, stream: bool) -> Any:
        p = self.pending
        if p is None:
            return self.plain_submit(r, conn, sink, stream)
        if "produce" in p:
            if self.role not in ("prefill", "both"):
                raise ApiError(
                    400, f"this server's disaggregation role is {self.role}; it does not prefill for a peer"
                )
            return self._produce(r, conn, sink, stream, p["produce"] or r.rid)
        if self.role not in ("decode", "both"):
            raise ApiError(
                400, f"this server's disaggregation role is {self.role}; it does not decode for a peer"
            )
        if stream:
            conn.start_stream()
        task = asyncio.ensure_future(self._consume(r, conn, p))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        conn.on_close = task.cancel
        return None

    def _produce(self, r: Req, conn: Conn, sink: Any, stream: bool, key: str) -> Any:
        r.max_new = 1  # the prefill side computes the prompt and the first token only
        self.rooms.setdefault(key, Room()).tokens = r.prompt_len
        self.prefill_inflight += 1
        if self.flavour == "vllm" and hasattr(sink, "conn"):
            host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or self.app.cfg.host
            extra = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.app.engine_id,
                "remote_block_ids": [],
                "remote_host": host,
                "remote_port": self.app.cfg.port,
                "remote_request_id": key,
            }
            sink.conn = _AddKvParams(conn, extra)
        r.sink = _ProducerSink(sink, self, key)
        return self.plain_submit(r, conn, r.sink, stream)

    def produced(self, key: str, r: Req, failed: str | None) -> None:
        self.prefill_inflight -= 1
        room = self.rooms.setdefault(key, Room())
        if failed:
            room.status, room.reason = "failed", failed
            self.c.transfer_failed += 1
            self.log.line(f"enginesim: KV transfer failed room={key} reason={failed}")
        else:
            room.status = "ready"
            room.tokens = r.prompt_len
            room.nbytes = r.prompt_len * self.e.cap.kv_bytes_per_token
            room.transfer_s = self.link.transfer_s(room.nbytes)
            self.c.rooms_produced += 1
            self.log.line(
                f"enginesim: KV ready room={key} tokens={r.prompt_len} bytes={int(room.nbytes)} "
                f"transfer_ms={room.transfer_s * 1000:.3f}"
            )
        room.event.set()
        self._prune()

    def _prune(self) -> None:
        now = time.monotonic()
        for k in [k for k, v in self.rooms.items() if v.status != "open" and now - v.opened > ROOM_TTL_S]:
            del self.rooms[k]

    async def room_route(self, req: Request, conn: Conn) -> Response:
        """The prefill side's bootstrap: wait until the room is ready (or failed), hand over its KV size."""
        key = req.query.get("room", "")
        if not key:
            return Response(400, dumps({"error": "room is required"}))
        room = self.rooms.setdefault(key, Room())
        try:
            await asyncio.wait_for(room.event.wait(), ROOM_WAIT_S)
        except TimeoutError:
            return Response(504, dumps({"error": f"room {key} not ready after {ROOM_WAIT_S:.0f} s"}))
        self.rooms.pop(key, None)
        if room.status == "failed":
            return Response(500, dumps({"error": f"prefill failed: {room.reason}"}))
        if self.e.dead:
            return Response(500, dumps({"error": f"prefill engine dead: {self.e.dead}"}))
        self.c.transfers_ok += 1
        self.c.bytes_total += room.nbytes
        self.c.transfer_seconds_total += room.transfer_s
        body = {"tokens": room.tokens, "bytes": room.nbytes, "transfer_s": room.transfer_s}
        return Response(200, dumps(body))

    async def _consume(self, r: Req, conn: Conn, p: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self.decode_bootstrap += 1
        try:
            status, body = await httpclient.fetch(
                p["host"],
                p["port"],
                "GET",
                f"{ROOM_PATH}?room={quote(p['consume'])}",
                timeout=ROOM_WAIT_S + 5,
            )
        except httpclient.HopError as e:
            self.c.bootstrap_failed += 1
            return self._fail(r, f"KV bootstrap with the prefill side {p['host']}:{p['port']} failed: {e}")
        finally:
            self.decode_bootstrap -= 1
        self.c.last_bootstrap_ms = (time.perf_counter() - t0) * 1000
        if status != 200:
            self.c.transfer_failed += 1
            return self._fail(
                r, f"KV transfer from {p['host']}:{p['port']} failed: {body.decode(errors='replace')}"
            )
        info = loads(body)
        self.decode_transfer += 1
        try:
            await asyncio.sleep(info["transfer_s"] * self.e.scale)
        finally:
            self.decode_transfer -= 1
        c = self.c
        c.transfers_ok += 1
        c.bytes_total += info["bytes"]
        c.transfer_seconds_total += info["transfer_s"]
        c.last_latency_ms = info["transfer_s"] * 1000
        c.last_mb = info["bytes"] / 1e6
        c.last_speed_gb_s = info["bytes"] / 1e9 / info["transfer_s"] if info["transfer_s"] else 0.0
        self.log.line(
            f"enginesim: KV received room={p['consume']} tokens={info['tokens']} bytes={int(info['bytes'])} "
            f"transfer_ms={info['transfer_s'] * 1000:.3f} bootstrap_ms={c.last_bootstrap_ms:.1f}"
        )
        if self.e.dead:
            return self._fail(r, f"Engine is dead: {self.e.dead}")
        tree = self.e.tree
        if tree is not None:  # the transferred KV lands in this pool: the scheduler finds the prompt cached
            need = r.prompt_len - self.e.free_tokens()
            if need > 0:
                tree.evict(need)
            tree.insert(r.ctx[: r.prompt_len])
        conn.on_close = lambda: self.e.abort(r)
        self.e.submit(r)

    def _fail(self, r: Req, message: str) -> None:
        self.log.line(f"enginesim: {message}")
        r.finished = True
        r.finish_reason = {"type": "abort", "message": message}
        r.sink.fail(r, message)

    # ---- evidence -------------------------------------------------------------------------------
    def _metrics(self, handler: Any) -> Any:
        def route(req: Request, conn: Conn) -> Response:
            out = handler(req, conn)
            return Response(out.status, out.body + self.exposition().encode(), out.content_type)

        return route

    def exposition(self) -> str:
        x = Exposition()
        c = self.c
        lab = f'engine_type="{self.role}",model_name="{self.app.served}",pp_rank="0",tp_rank="0"'
        if self.flavour == "sglang":  # the PD names of SGLang's scheduler metrics
            for name, kind, help_, v in (
                (
                    "num_prefill_inflight_queue_reqs",
                    "gauge",
                    "Requests in the prefill inflight queue.",
                    self.prefill_inflight,
                ),
                (
                    "num_decode_prealloc_queue_reqs",
                    "gauge",
                    "Requests waiting for bootstrap.",
                    self.decode_bootstrap,
                ),
                (
                    "num_decode_transfer_queue_reqs",
                    "gauge",
                    "Requests whose KV is in transfer.",
                    self.decode_transfer,
                ),
                ("num_bootstrap_failed_reqs_total", "counter", "Bootstrap failures.", c.bootstrap_failed),
                ("num_transfer_failed_reqs_total", "counter", "KV transfer failures.", c.transfer_failed),
                ("kv_transfer_latency_ms", "gauge", "Latency of the last KV transfer.", c.last_latency_ms),
                ("kv_transfer_speed_gb_s", "gauge", "Speed of the last KV transfer.", c.last_speed_gb_s),
                ("kv_transfer_total_mb", "gauge", "Size of the last KV transfer.", c.last_mb),
                (
                    "kv_transfer_bootstrap_ms",
                    "gauge",
                    "Bootstrap time of the last transfer.",
                    c.last_bootstrap_ms,
                ),
            ):
                x.metric(f"sglang:{name}", kind, help_, [(lab, v)])
        for name, kind, help_, v in (
            ("kv_transfers_total", "counter", "KV transfers completed on this side.", c.transfers_ok),
            ("kv_transfer_failures_total", "counter", "KV transfers failed.", c.transfer_failed),
            (
                "kv_bootstrap_failures_total",
                "counter",
                "Handshakes with the prefill side failed.",
                c.bootstrap_failed,
            ),
            ("kv_transfer_bytes_total", "counter", "KV bytes transferred.", c.bytes_total),
            (
                "kv_transfer_seconds_total",
                "counter",
                "Emulated seconds of KV transfer.",
                c.transfer_seconds_total,
            ),
            (
                "pd_prefill_inflight_reqs",
                "gauge",
                "Producer requests in the prefill engine.",
                self.prefill_inflight,
            ),
            (
                "pd_decode_bootstrap_reqs",
                "gauge",
                "Consumer requests waiting for their room.",
                self.decode_bootstrap,
            ),
            (
                "pd_decode_transfer_reqs",
                "gauge",
                "Consumer requests whose KV is on the wire.",
                self.decode_transfer,
            ),
        ):
            x.metric(f"enginesim:{name}", kind, help_, [(f'role="{self.role}"', v)])
        return x.text()


class _ProducerSink:
    """Marks the room ready (or failed) when the prefill side's request ends, then writes as usual."""

    __slots__ = ("inner", "key", "pd")

    def __init__(self, inner: Any, pd: Disagg, key: str) -> None:
        self.inner, self.pd, self.key = inner, pd, key

    def emit(self, r: Req, finished: bool) -> None:
        if finished:
            fr = r.finish_reason or {}
            self.pd.produced(self.key, r, fr.get("message") if fr.get("type") == "abort" else None)
        self.inner.emit(r, finished)

    def fail(self, r: Req, message: str) -> None:
        self.pd.produced(self.key, r, message)
        self.inner.fail(r, message)


class _AddKvParams:
    """vLLM's prefill answer carries `kv_transfer_params` for the decode side (NIXL connector style)."""

    def __init__(self, conn: Conn, params: dict[str, Any]) -> None:
        self._conn, self._params = conn, params

    def send(self, resp: Response) -> None:
        if resp.status == 200:
            body = loads(resp.body)
            body["kv_transfer_params"] = self._params
            resp = Response(200, dumps(body), resp.content_type)
        self._conn.send(resp)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def attach(app: Any, log: Any, env: dict[str, str] | None = None) -> Any:
    """Give the App its disaggregation role (None when the flags ask for none); SGLang's prefill side
    also listens on --disaggregation-bootstrap-port. Returns the bootstrap server (or None)."""
    raw = app.cfg.raw
    role = role_of(raw)
    if role is None:
        return None
    app.engine_id = (raw.get("kv_transfer_config") or {}).get("engine_id") or f"enginesim-{os.getpid()}"
    pd = Disagg(app, role, link_of(raw, dict(os.environ if env is None else env)), log)
    app.pd = pd
    backend = raw.get("disaggregation_transfer_backend") or (raw.get("kv_transfer_config") or {}).get(
        "kv_connector"
    )
    log.line(
        f"enginesim: disaggregation role={role} transfer_backend={backend} "
        f"link={pd.link.bytes_per_s / 1e9:g}GB/s fixed={pd.link.fixed_s * 1000:g}ms"
    )
    if role == "prefill" and app.cfg.flavour == "sglang":
        port = int(raw.get("disaggregation_bootstrap_port") or 8998)
        return await serve(app.cfg.host, port, app.dispatch)
    return None
