"""Start-up and lifetime of one emulated engine process (head or worker rank).

Order, like the real engines: parse flags (refuse bad ones), print the start-up preamble, "load
weights" (the slow-start knob sleeps here; the OOM knob dies here), size the KV pool and print it,
wait for every rank, then serve. The HTTP port listens from the start so /health answers 503 until
the engine is ready. Every line an engine prints its own way comes from its flavour (flavours/).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
from typing import Any

from . import (
    api,
    capacity,
    catalog,
    cli,
    cluster,
    disagg,
    dp,
    flavours,
    nccl,
    profiling,
    quantization,
    schedproc,
)
from .engine import Engine
from .flavours.base import Flavour
from .httpserver import serve
from .logs import Logger
from .scheduler import build_cost
from .tokenizer import Tokenizer


def _tp_suffix(cfg: cli.Config) -> str:
    if dp.size(cfg) > 1:
        return dp.rank_suffix(cfg, 0)
    if cfg.tp == 1 and cfg.nnodes == 1:
        return ""
    local = cfg.tp // cfg.nnodes
    return f" TP{cfg.node_rank * local}"


def _startup_failure(fl: Flavour, log: Logger, message: str) -> None:
    fl.startup_failure(log, message)
    sys.stdout.flush()
    os._exit(1)


def main(argv: list[str]) -> int:
    cfg = cli.parse(argv)
    if cfg.sim.scheduler_process and not schedproc.in_child():
        return schedproc.run_parent(argv, cfg.flavour)
    hw = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)
    log = Logger(cfg.flavour, _tp_suffix(cfg))
    try:
        model = quantization.apply(
            quantization.load_checkpoint(cfg.model_path),
            cfg.raw.get("quantization"),
            hw,
            cfg.flavour,
            dict(os.environ),
        )
    except quantization.QuantError as e:
        log.error(str(e))
        return 1
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(_amain(cfg, model, hw, log))
    except KeyboardInterrupt:
        return 0


async def _amain(cfg: cli.Config, model: catalog.ModelSpec, hw: catalog.Hardware, log: Logger) -> int:
    """Start, then serve as the head or join it as a worker rank, until SIGTERM/SIGINT."""
    fl = flavours.get(cfg.flavour)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await _load_weights(cfg, fl, log, model, hw)
    cap = _size_kv_pool(cfg, fl, log, model, hw)
    env = dict(os.environ)
    nccl_info = env.get("NCCL_DEBUG", "").upper() == "INFO" and cfg.nnodes > 1
    local_ranks = max(1, cfg.tp // cfg.nnodes)
    if cfg.node_rank > 0:
        return await _worker(cfg, log, env, nccl_info, local_ranks, stop)
    engine: Any = (
        dp.DPEngine(cfg, fl, model, hw, cap, log)
        if dp.size(cfg) > 1
        else Engine(cfg, model, cap, build_cost(cfg, model, hw, cap), log)
    )
    app = api.App(engine, Tokenizer(model.vocab), _server_info(cfg, fl, cap))
    profiling.attach(app, engine, cfg.flavour, cfg.tp, cfg.sim.time_scale, log, env)
    engine.on_crash = _crash_handler(fl, log, engine, loop)
    try:
        server = await serve(cfg.host, cfg.port, app.dispatch)
    except OSError as e:
        log.error(f"bind to {cfg.host}:{cfg.port} failed: {e}", rank=False)
        return 1
    try:
        bootstrap = await disagg.attach(app, log)
    except OSError as e:
        log.error(f"disaggregation bootstrap server failed to bind: {e}", rank=False)
        return 1
    sched = asyncio.ensure_future(engine.run())
    head_server = None
    if cfg.nnodes > 1:
        joined, head_server = await _wait_for_ranks(cfg, fl, log, engine, env, nccl_info, local_ranks, stop)
        if not joined:
            return 0 if head_server is not None or stop.is_set() else 1
    # What exists now (vocabulary, catalog, cost tables) lives as long as the process: out of the
    # collector's sight, a full collection in a case's burst costs ~0 ms instead of 5-20 ms.
    gc.collect()
    gc.freeze()
    fl.ready_lines(cfg, log)
    engine.ready = True
    await stop.wait()
    if bootstrap is not None:
        bootstrap.close()
    _shut_down(fl, log, engine, server, head_server, sched)
    return 0


async def _load_weights(
    cfg: cli.Config, fl: Flavour, log: Logger, model: catalog.ModelSpec, hw: catalog.Hardware
) -> None:
    """The preamble, then "weight loading": the slow-start knob sleeps here, the OOM knob dies here."""
    fl.preamble(cfg, log, model, hw)
    for line in quantization.log_lines(model):
        fl.quantization_line(cfg, log, line)
    if cfg.sim.start_delay_s:
        await asyncio.sleep(cfg.sim.start_delay_s)
    if cfg.sim.oom_at_start:
        gib = model.weight_bytes_per_gpu(cfg.tp) / (1 << 30)
        _startup_failure(
            fl,
            log,
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {max(gib / 4, 0.5):.2f} GiB. "
            f"GPU 0 has a total capacity of {hw.mem_bytes / (1 << 30):.2f} GiB of which 312.00 MiB is free. "
            f"Process {os.getpid()} has {hw.mem_bytes / (1 << 30) - 0.3:.2f} GiB memory in use. Of the "
            "allocated memory 1.02 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        )


def _size_kv_pool(
    cfg: cli.Config, fl: Flavour, log: Logger, model: catalog.ModelSpec, hw: catalog.Hardware
) -> capacity.Capacity:
    """Size the KV pool and print it (dying like the engine when it does not fit); capture graphs."""
    try:
        cap = capacity.compute(cfg, model, hw)
    except capacity.StartupOOM as e:
        _startup_failure(fl, log, str(e))
        raise
    assert cap.lines is not None
    for line in cap.lines:
        if line.startswith("max_total_num_tokens") and cfg.node_rank != 0:
            continue
        fl.capacity_line(log, line)
    if cfg.cuda_graph:
        fl.graph_lines(log)
    return cap


def _server_info(cfg: cli.Config, fl: Flavour, cap: capacity.Capacity) -> dict[str, Any]:
    """Server args + capacity, as /server_info reports them."""
    info: dict[str, Any] = {k: v for k, v in cfg.raw.items() if not k.startswith("sim_")}
    info.update(
        {
            "served_model_name": cfg.served_model_name,
            "max_running_requests": cap.max_running,
            "max_total_tokens": cfg.max_total_tokens,
            "chunked_prefill_size": cfg.chunk or -1,
            "tp_size": cfg.tp,
            "ep_size": cfg.ep,
            "nnodes": cfg.nnodes,
            "enable_metrics": cfg.enable_metrics,
            "speculative_algorithm": cfg.spec_algorithm,
            "context_length": cap.context_len,
            "mem_fraction_static": fl.mem_fraction(cfg),
        }
    )
    return info


def _crash_handler(fl: Flavour, log: Logger, engine: Engine, loop: asyncio.AbstractEventLoop) -> Any:
    """The injected crash (--sim-crash-after): the engine's fatal lines, then it is dead and exits."""

    def crash(msg: str) -> None:
        fl.fatal(log, msg)
        sys.stdout.flush()
        # Dead from this line on, like the real engine: no further step runs, new requests are refused
        # and the ones in flight fail (at a small time scale the 50 ms before exit would otherwise let
        # whole requests finish successfully after the fatal error was logged).
        engine.dead = msg
        loop.call_soon(engine.fail_all, f"engine dead: {msg}")
        loop.call_later(0.05, os._exit, 1)

    return crash


async def _wait_for_ranks(
    cfg: cli.Config,
    fl: Flavour,
    log: Logger,
    engine: Engine,
    env: dict[str, str],
    nccl_info: bool,
    local_ranks: int,
    stop: asyncio.Event,
) -> tuple[bool, Any]:
    """Listen on --dist-init-addr until every rank joined (True) or SIGTERM (False); a rank lost later
    kills the engine with the NCCL and engine fatal lines. Returns (joined, listening server or None)."""

    def lost(rank: int, peer: str) -> None:
        if engine.dead:
            return
        for line in nccl.peer_lost_lines(peer):
            log.raw(line)
        msg = (
            f"NCCL error: remote process exited or there was a network error, NCCL version "
            f"{nccl.NCCL_VERSION.split('+')[0]}\nncclRemoteError: A call failed possibly due to a network "
            f"error "
            f"or a remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by "
            f"remote peer {peer} (node rank {rank})"
        )
        engine.dead = f"node rank {rank} lost: {peer}"
        fl.peer_lost(log, msg)
        engine.fail_all(f"engine dead: node rank {rank} lost ({peer})")

    head = cluster.Head(cfg.nnodes, lost, lambda m: log.info(m, rank=False))
    assert cfg.dist_init_addr
    try:
        head_server = await head.start(cfg.dist_init_addr)
    except OSError as e:
        log.error(f"cannot listen on --dist-init-addr {cfg.dist_init_addr}: {e}", rank=False)
        return False, None
    waiter = asyncio.ensure_future(head.all_joined.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        return False, head_server
    if nccl_info:
        for line in nccl.init_lines(env, cfg.sim.ib_dir, 0, cfg.nnodes, local_ranks):
            log.raw(line)
    return True, head_server


def _shut_down(fl: Flavour, log: Logger, engine: Engine, server: Any, head_server: Any, sched: Any) -> None:
    fl.shutdown(log)
    server.close()
    if head_server is not None:
        head_server.close()
    sched.cancel()
    lag = engine.lag_summary()
    log.raw(
        f"enginesim: sched_lag_ms p50={lag['p50']} p99={lag['p99']} max={lag['max']} steps={lag['steps']} "
        f"events={engine.stats.events} slips={engine.evidence.slips}"
    )


async def _worker(
    cfg: cli.Config, log: Logger, env: dict[str, str], nccl_info: bool, local_ranks: int, stop: asyncio.Event
) -> int:
    assert cfg.dist_init_addr
    timeout = float(cfg.raw.get("dist_timeout") or 600)
    join = asyncio.ensure_future(
        cluster.join(cfg.dist_init_addr, cfg.node_rank, timeout, lambda m: log.info(m))
    )
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([join, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        join.cancel()
        return 0
    try:
        reader, writer = join.result()
    except (TimeoutError, RuntimeError) as e:
        log.error(f"Init torch distributed failed: {e}", rank=True)
        return 1
    if nccl_info:
        for line in nccl.init_lines(env, cfg.sim.ib_dir, cfg.node_rank, cfg.nnodes, local_ranks):
            log.raw(line)
    log.info(f"node rank {cfg.node_rank} joined the head at {cfg.dist_init_addr} ({socket.gethostname()})")
    hb = asyncio.ensure_future(cluster.heartbeat(reader, writer))
    await asyncio.wait([hb, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        writer.close()
        return 0
    log.error(
        f"Scheduler hit an exception: torch.distributed.DistBackendError: NCCL error: remote process exited "
        f"or there was a network error ({hb.result()})",
        rank=True,
    )
    return 1
