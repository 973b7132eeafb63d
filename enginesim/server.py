"""Start-up and lifetime of one emulated engine process (head or worker rank).

Order, like the real engines: parse flags (refuse bad ones), print the start-up preamble, "load
weights" (the slow-start knob sleeps here; the OOM knob dies here), size the KV pool and print it,
wait for every rank, then serve. The HTTP port listens from the start so /health answers 503 until
the engine is ready.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from typing import Any

from . import api, capacity, catalog, cli, cluster, nccl, profiling, quantization
from .costmodel import CostModel
from .engine import Engine
from .httpserver import serve
from .logs import Logger
from .tokenizer import Tokenizer


def _tp_suffix(cfg: cli.Config) -> str:
    if cfg.tp == 1 and cfg.nnodes == 1:
        return ""
    local = cfg.tp // cfg.nnodes
    return f" TP{cfg.node_rank * local}"


def _preamble(cfg: cli.Config, log: Logger, model: catalog.ModelSpec) -> None:
    if cfg.flavour == "sglang":
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.raw.items() if not k.startswith("sim_"))
        log.sgl(f"server_args=ServerArgs({args})")
        if not cfg.raw.get("attention_backend"):
            log.sgl("Attention backend not specified. Use fa3 backend by default.")
        log.sgl("Init torch distributed begin.", rank=True)
        log.sgl("Init torch distributed ends. mem usage=0.00 GB", rank=True)
        mem_gb = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override).mem_bytes / (1 << 30)
        log.sgl(
            f"Load weight begin. avail mem={mem_gb:.2f} GB",
            rank=True,
        )
    else:
        log.vllm(f"vLLM API server version {api.VLLM_VERSION}", src="api_server.py:1839")
        nondefault = {k: v for k, v in cfg.raw.items() if v not in (None, False) and not k.startswith("sim_")}
        log.vllm(f"non-default args: {nondefault}", src="utils.py:233")
        log.vllm(
            f"Initializing a V1 LLM engine (v{api.VLLM_VERSION}) with config: model={cfg.model_path!r}, "
            f"served_model_name={cfg.served_model_name}, max_seq_len={cfg.context_length or model.context}, "
            f"tensor_parallel_size={cfg.tp}, kv_cache_dtype={cfg.kv_cache_dtype}, "
            f"enable_prefix_caching={cfg.prefix_cache}, enforce_eager={not cfg.cuda_graph}",
            src="core.py:93",
            proc="EngineCore_DP0",
        )


def _oom_exit(cfg: cli.Config, log: Logger, message: str) -> None:
    if cfg.flavour == "sglang":
        log.sgl("Scheduler hit an exception: Traceback (most recent call last):", rank=True)
        log.raw(
            '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 412, '
            "in load_model"
        )
        log.raw(message)
        log.sgl("Received sigquit from a child process. It usually means the child failed.")
    else:
        log.vllm("EngineCore failed to start.", src="core.py:708", proc="EngineCore_DP0", level="ERROR")
        log.raw("Traceback (most recent call last):")
        log.raw(message)
        log.raw(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
        )
    sys.stdout.flush()
    os._exit(1)


def main(argv: list[str]) -> int:
    cfg = cli.parse(argv)
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
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _preamble(cfg, log, model)
    for q in quantization.log_lines(model):
        if cfg.flavour == "sglang":
            log.sgl(q.text, rank=True, level=q.level)
        else:
            log.vllm(q.text, src=q.src, proc="Worker_TP0" if cfg.tp > 1 else "EngineCore_DP0", level=q.level)
    if cfg.sim.start_delay_s:
        await asyncio.sleep(cfg.sim.start_delay_s)
    if cfg.sim.oom_at_start:
        gib = model.weight_bytes_per_gpu(cfg.tp) / (1 << 30)
        _oom_exit(
            cfg,
            log,
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {max(gib / 4, 0.5):.2f} GiB. "
            f"GPU 0 has a total capacity of {hw.mem_bytes / (1 << 30):.2f} GiB of which 312.00 MiB is free. "
            f"Process {os.getpid()} has {hw.mem_bytes / (1 << 30) - 0.3:.2f} GiB memory in use. Of the "
            "allocated memory 1.02 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        )
    try:
        cap = capacity.compute(cfg, model, hw)
    except capacity.StartupOOM as e:
        _oom_exit(cfg, log, str(e))
        raise
    assert cap.lines is not None
    for line in cap.lines:
        if line.startswith("max_total_num_tokens") and cfg.node_rank != 0:
            continue
        if cfg.flavour == "sglang":
            log.sgl(line, rank=True)
        else:
            src = (
                "kv_cache_utils.py:1087"
                if "KV cache size" in line or "Maximum concurrency" in line
                else "gpu_worker.py:298"
                if "Available" in line
                else "gpu_model_runner.py:2602"
            )
            log.vllm(line, src=src, proc="EngineCore_DP0")
    if cfg.cuda_graph:
        if cfg.flavour == "sglang":
            log.sgl(
                "Capture cuda graph begin. This can take up to several minutes. avail mem=12.00 GB",
                rank=True,
            )
            log.sgl(
                "Capture cuda graph end. Time elapsed: 1.02 s. mem usage=0.06 GB. avail mem=11.94 GB.",
                rank=True,
            )
        else:
            log.vllm(
                "Graph capturing finished in 2 secs, took 0.06 GiB",
                src="gpu_model_runner.py:3480",
                proc="EngineCore_DP0",
            )
    env = dict(os.environ)
    nccl_info = env.get("NCCL_DEBUG", "").upper() == "INFO" and cfg.nnodes > 1
    local_ranks = max(1, cfg.tp // cfg.nnodes)
    if cfg.node_rank > 0:
        return await _worker(cfg, log, env, nccl_info, local_ranks, stop)

    cost = CostModel(
        model,
        hw,
        cfg.tp,
        cfg.ep,
        cfg.nnodes,
        cap.kv_bytes_per_token,
        cfg.cuda_graph,
        cfg.cuda_graph_max_bs,
        graph_covers_mixed=cfg.flavour == "vllm",
    )
    engine = Engine(cfg, model, cap, cost, log)
    tok = Tokenizer(model.vocab)
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
            "mem_fraction_static": cfg.mem_fraction or capacity.SGLANG_DEFAULT_MEM_FRACTION,
        }
    )
    app = api.App(engine, tok, info)
    profiling.attach(app, engine, cfg.flavour, cfg.tp, cfg.sim.time_scale, log, dict(os.environ))

    def crash(msg: str) -> None:
        if cfg.flavour == "sglang":
            log.sgl("Scheduler hit an exception: Traceback (most recent call last):", rank=True)
            log.raw(f"RuntimeError: {msg}")
            log.sgl("Received sigquit from a child process. It usually means the child failed.")
        else:
            log.vllm(
                "EngineCore encountered a fatal error.",
                src="core.py:710",
                proc="EngineCore_DP0",
                level="ERROR",
            )
            log.raw(f"RuntimeError: {msg}")
            log.vllm("AsyncLLM output_handler failed.", src="async_llm.py:480", level="ERROR")
            log.raw(
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause."
            )
        sys.stdout.flush()
        # Dead from this line on, like the real engine: no further step runs, new requests are refused
        # and the ones in flight fail (at a small time scale the 50 ms before exit would otherwise let
        # whole requests finish successfully after the fatal error was logged).
        engine.dead = msg
        loop.call_soon(engine.fail_all, f"engine dead: {msg}")
        loop.call_later(0.05, os._exit, 1)

    engine.on_crash = crash
    try:
        server = await serve(cfg.host, cfg.port, app.dispatch)
    except OSError as e:
        log.error(f"bind to {cfg.host}:{cfg.port} failed: {e}", rank=False)
        return 1
    sched = asyncio.ensure_future(engine.run())

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
        if cfg.flavour == "sglang":
            log.sgl(f"Scheduler hit an exception: torch.distributed.DistBackendError: {msg}", rank=True)
        else:
            log.vllm(
                f"EngineCore encountered a fatal error. {msg}",
                src="core.py:710",
                proc="EngineCore_DP0",
                level="ERROR",
            )
        engine.fail_all(f"engine dead: node rank {rank} lost ({peer})")

    head = cluster.Head(cfg.nnodes, lost, lambda m: log.info(m, rank=False))
    head_server = None
    if cfg.nnodes > 1:
        assert cfg.dist_init_addr
        try:
            head_server = await head.start(cfg.dist_init_addr)
        except OSError as e:
            log.error(f"cannot listen on --dist-init-addr {cfg.dist_init_addr}: {e}", rank=False)
            return 1
        waiter = asyncio.ensure_future(head.all_joined.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            return 0
        if nccl_info:
            for line in nccl.init_lines(env, cfg.sim.ib_dir, 0, cfg.nnodes, local_ranks):
                log.raw(line)
    _ready_lines(cfg, log)
    engine.ready = True
    await stop.wait()
    if cfg.flavour == "sglang":
        log.sgl("Received signal, shutting down.")
    else:
        log.vllm("Shutting down FastAPI HTTP server.", src="launcher.py:101")
    server.close()
    if head_server is not None:
        head_server.close()
    sched.cancel()
    lag = engine.lag_summary()
    log.raw(
        f"enginesim: sched_lag_ms p50={lag['p50']} p99={lag['p99']} max={lag['max']} steps={lag['steps']} "
        f"events={engine.stats.events}"
    )
    return 0


def _ready_lines(cfg: cli.Config, log: Logger) -> None:
    url = f"http://{cfg.host}:{cfg.port}"
    if cfg.flavour == "vllm":
        log.vllm(f"Starting vLLM API server 0 on {url}", src="launcher.py:44")
    log.raw(f"INFO:     Started server process [{os.getpid()}]")
    log.raw("INFO:     Waiting for application startup.")
    log.raw("INFO:     Application startup complete.")
    if cfg.flavour == "sglang":
        log.raw(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
        log.sgl("The server is fired up and ready to roll!")


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
