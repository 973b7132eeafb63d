"""vLLM 0.11.2 (V1 engine) as the emulator speaks it: `vllm serve` flags, `(proc pid=N) LEVEL time [src]`
log lines, the OpenAI surface and its error bodies, the `vllm:*` metrics, and its scheduler (one step
= running requests first, then waiting ones, within the token budget; recompute preemption of the
newest request). enginesim/README.md describes each; this file is the one place they live.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import TYPE_CHECKING, Any

from .. import disagg_flags
from ..capacity import GB, Capacity, StartupOOM
from ..cli import Config, add_sim_flags, check_dist, check_model, kv_bytes, positive, sim_knobs
from ..httpserver import Response
from ..metrics import VLLM_E2E_BUCKETS, VLLM_ITL_BUCKETS, VLLM_TTFT_BUCKETS, vllm_exposition
from .base import Flavour

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..catalog import Hardware, ModelSpec
    from ..logs import Logger
    from ..scheduler import Req, Scheduler

Plan = tuple[list[tuple["Req", int]], list["Req"], int, int]
KV_DTYPES = ["auto", "fp8", "fp8_e5m2", "fp8_e4m3", "bfloat16", "fp8_inc", "fp8_ds_mla"]
CORE = "EngineCore_DP0"


class VLLM(Flavour):
    name = "vllm"
    title = "vLLM"
    version = "0.11.2"
    argv_head = ("vllm", "serve")
    owned_by = "vllm"
    graph_covers_mixed = True
    decode_in_token_budget = True
    prompt_tokens_at_first_token = True

    # ---- flags --------------------------------------------------------------------------------------
    def parser(self, version: str | None = None) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(
            prog="vllm serve", usage="vllm serve [model_tag] [options]", allow_abbrev=False
        )
        a = p.add_argument
        a("model_tag", nargs="?")
        a("--model")
        a("--tokenizer")
        a("--served-model-name", nargs="+")
        a("--host", default="127.0.0.1")
        a("--port", type=int, default=8000)
        a("--gpu-memory-utilization", type=float, default=0.9)
        a("--max-model-len", type=int)
        a("--max-num-seqs", type=positive("max-num-seqs"))
        a("--max-num-batched-tokens", type=positive("max-num-batched-tokens"))
        a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
        a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
        a("--enforce-eager", action="store_true")
        a("--num-gpu-blocks-override", type=positive("num-gpu-blocks-override"))
        a("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128], default=16)
        a("--kv-cache-dtype", choices=KV_DTYPES, default="auto")
        a("--speculative-config", type=json.loads)
        a("--tensor-parallel-size", "-tp", type=positive("tensor-parallel-size"), default=1)
        a("--pipeline-parallel-size", "-pp", type=int, default=1)
        a("--data-parallel-size", "-dp", type=int, default=1)
        a("--enable-expert-parallel", action="store_true")
        a("--nnodes", type=positive("nnodes"), default=1)
        a("--node-rank", type=int, default=0)
        a("--master-addr")
        a("--master-port", type=int)
        a("--headless", action="store_true")
        a("--distributed-executor-backend")
        a("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
        a("--dtype", default="auto")
        a("--quantization", "-q")
        a("--trust-remote-code", action="store_true")
        a("--seed", type=int)
        a("--swap-space", type=float)
        a("--max-logprobs", type=int)
        a("--disable-log-requests", action="store_true")
        a("--enable-log-requests", action="store_true")
        a("--disable-log-stats", action="store_true")
        a("--enable-prompt-tokens-details", action="store_true")
        a("--uvicorn-log-level")
        a("--api-key")
        a("--compilation-config", "-O")
        a("--cuda-graph-sizes", type=int, nargs="+")
        a("--max-seq-len-to-capture", type=int)
        a("--load-format")
        a("--download-dir")
        a("--generation-config")
        a("--chat-template")
        a("--tokenizer-mode")
        a("--revision")
        a("--async-scheduling", action="store_true")
        a("--disable-uvicorn-access-log", action="store_true")
        disagg_flags.add_vllm(a)
        add_sim_flags(p)
        return p

    def config(
        self, p: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], env: dict[str, str]
    ) -> Config:
        model_name = ns.model_tag or ns.model
        if not model_name:
            p.error("the following arguments are required: model_tag (or --model)")
        model = check_model(p, "model_tag", model_name)
        sim = sim_knobs(ns, env, p.error)
        if not 0 < ns.gpu_memory_utilization <= 1:
            p.error(f"argument --gpu-memory-utilization: {ns.gpu_memory_utilization} must be in (0, 1]")
        addr = f"{ns.master_addr}:{ns.master_port or 29501}" if ns.master_addr else None
        check_dist(p, ns.nnodes, ns.node_rank, addr, "--master-addr")
        spec_cfg = ns.speculative_config
        spec, n_spec, pl_min, pl_max = None, 0, 1, 4
        if spec_cfg is not None:
            if not isinstance(spec_cfg, dict):
                p.error(f"argument --speculative-config: {spec_cfg!r} must be a JSON object")
            method = spec_cfg.get("method")
            if method not in ("ngram", "[ngram]"):
                p.error(
                    f"argument --speculative-config: method {method!r} needs a draft model; "
                    "enginesim emulates 'ngram' only"
                )
            n_spec = spec_cfg.get("num_speculative_tokens")
            if not isinstance(n_spec, int) or n_spec < 1:
                p.error("argument --speculative-config: num_speculative_tokens must be an integer >= 1")
            spec = "NGRAM"
            pl_max = int(spec_cfg.get("prompt_lookup_max", 4))
            pl_min = int(spec_cfg.get("prompt_lookup_min", pl_max))
        served = ns.served_model_name[0] if ns.served_model_name else model_name
        return Config(
            flavour="vllm",
            argv=argv,
            model_path=model_name,
            served_model_name=served,
            host=ns.host,
            port=ns.port,
            mem_fraction=ns.gpu_memory_utilization,
            context_length=ns.max_model_len,
            max_running=ns.max_num_seqs or 256,
            chunk=ns.max_num_batched_tokens or 8192,
            max_prefill_tokens=ns.max_num_batched_tokens or 8192,
            mixed_chunk=True,
            enable_metrics=True,
            cuda_graph=not ns.enforce_eager,
            cuda_graph_max_bs=max(ns.cuda_graph_sizes) if ns.cuda_graph_sizes else 512,
            max_total_tokens=None,
            num_gpu_blocks_override=ns.num_gpu_blocks_override,
            prefix_cache=ns.enable_prefix_caching,
            page_size=ns.block_size,
            spec_algorithm=spec,
            spec_num_draft_tokens=n_spec + 1 if spec else 0,
            spec_min_match=pl_min,
            spec_max_match=pl_max,
            tp=ns.tensor_parallel_size,
            ep=1,
            nnodes=ns.nnodes,
            node_rank=ns.node_rank,
            dist_init_addr=addr,
            kv_cache_dtype=ns.kv_cache_dtype,
            kv_dtype_bytes=kv_bytes(ns.kv_cache_dtype, model.dtype_bytes),
            scheduling_policy=ns.scheduling_policy,
            decode_log_interval=40,
            stream_interval=1,
            sim=sim,
            raw=vars(ns),
        )

    # ---- KV capacity ----------------------------------------------------------------------------------
    def prefill_graph_max_tokens(self, cfg: Config) -> int:
        """V1's default cudagraph mode FULL_AND_PIECEWISE: uniform decode replays full graphs, steps with
        prefill tokens replay piecewise graphs (attention eager between the torch.compile pieces) up to
        the largest capture size; larger steps run the compiled code without graphs (priced eager here,
        an upper bound). --enforce-eager turns both off (docs.vllm.ai, design/cuda_graphs)."""
        return cfg.cuda_graph_max_bs if cfg.cuda_graph else 0

    def capacity(self, cfg: Config, model: ModelSpec, hw: Hardware) -> Capacity:
        """kv = mem x gpu_memory_utilization - weights - activation peak of a max_num_batched_tokens
        profile run; blocks of --block-size tokens; refuses to start when one max-length request does
        not fit."""
        tp = cfg.tp
        kv_bpt = model.kv_bytes_per_token(cfg.kv_dtype_bytes, tp)
        weights = model.weight_bytes_per_gpu(tp)
        total = hw.mem_bytes
        ctx = cfg.context_length or model.context
        lines: list[str] = []
        util = cfg.mem_fraction or 0.9
        activation = (cfg.chunk or 8192) * model.hidden * 2 * 12 + 256 * (1 << 20)
        kv_mem = total * util - weights - activation
        block = cfg.page_size
        lines.append(f"Model loading took {weights / GB:.4f} GiB memory and 1.000000 seconds")
        if kv_mem <= 0 and not cfg.num_gpu_blocks_override:
            raise StartupOOM(
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
        lines.append(f"Available KV cache memory: {max(kv_mem, 0) / GB:.2f} GiB")
        blocks = int(max(kv_mem, 0) // (kv_bpt * block))
        if cfg.num_gpu_blocks_override:
            override = cfg.num_gpu_blocks_override
            lines.append(f"Overriding num_gpu_blocks={blocks} with num_gpu_blocks_override={override}")
            blocks = cfg.num_gpu_blocks_override
        elif blocks * block < ctx:
            raise StartupOOM(
                f"ValueError: To serve at least one request with the models's max seq len ({ctx}), "
                f"({ctx * kv_bpt / GB:.2f} GiB KV cache is needed, which is larger than the available KV "
                f"cache memory ({max(kv_mem, 0) / GB:.2f} GiB). Based on the available memory, the estimated "
                f"maximum model length is {blocks * block}. Try increasing `gpu_memory_utilization` or "
                "decreasing `max_model_len` when initializing the engine."
            )
        tokens = blocks * block
        lines.append(f"GPU KV cache size: {tokens:,} tokens")
        lines.append(f"Maximum concurrency for {ctx:,} tokens per request: {tokens / ctx:.2f}x")
        return Capacity(tokens, kv_bpt, weights, tokens * kv_bpt, ctx, cfg.max_running or 256, blocks, lines)

    def mem_fraction(self, cfg: Config) -> float:
        return cfg.mem_fraction or 0.9

    # ---- log lines ----------------------------------------------------------------------------------
    def format(self, msg: str, level: str, rank_suffix: str, pid: int, src: str, proc: str) -> str:
        """`(EngineCore_DP0 pid=164) INFO 01-23 15:50:06 [kv_cache_utils.py:1087] msg`."""
        del rank_suffix
        return f"({proc} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{src}] {msg}"

    def preamble(self, cfg: Config, log: Logger, model: ModelSpec, hw: Hardware) -> None:
        log.line(f"vLLM API server version {self.version}", src="api_server.py:1839")
        nondefault = {k: v for k, v in cfg.raw.items() if v not in (None, False) and not k.startswith("sim_")}
        log.line(f"non-default args: {nondefault}", src="utils.py:233")
        log.line(
            f"Initializing a V1 LLM engine (v{self.version}) with config: model={cfg.model_path!r}, "
            f"served_model_name={cfg.served_model_name}, max_seq_len={cfg.context_length or model.context}, "
            f"tensor_parallel_size={cfg.tp}, kv_cache_dtype={cfg.kv_cache_dtype}, "
            f"enable_prefix_caching={cfg.prefix_cache}, enforce_eager={not cfg.cuda_graph}",
            src="core.py:93",
            proc=CORE,
        )

    def quantization_line(self, cfg: Config, log: Logger, line: Any) -> None:
        proc = "Worker_TP0" if cfg.tp > 1 else CORE
        log.line(line.text, src=line.src, proc=proc, level=line.level)

    def capacity_line(self, log: Logger, line: str) -> None:
        src = (
            "kv_cache_utils.py:1087"
            if "KV cache size" in line or "Maximum concurrency" in line
            else "gpu_worker.py:298"
            if "Available" in line
            else "gpu_model_runner.py:2602"
        )
        log.line(line, src=src, proc=CORE)

    def graph_lines(self, log: Logger) -> None:
        log.line(
            "Graph capturing finished in 2 secs, took 0.06 GiB", src="gpu_model_runner.py:3480", proc=CORE
        )

    def ready_lines(self, cfg: Config, log: Logger) -> None:
        log.line(f"Starting vLLM API server 0 on http://{cfg.host}:{cfg.port}", src="launcher.py:44")
        log.raw(f"INFO:     Started server process [{os.getpid()}]")
        log.raw("INFO:     Waiting for application startup.")
        log.raw("INFO:     Application startup complete.")

    def startup_failure(self, log: Logger, message: str) -> None:
        log.line("EngineCore failed to start.", src="core.py:708", proc=CORE, level="ERROR")
        log.raw("Traceback (most recent call last):")
        log.raw(message)
        log.raw(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
        )

    def fatal(self, log: Logger, message: str) -> None:
        log.line("EngineCore encountered a fatal error.", src="core.py:710", proc=CORE, level="ERROR")
        log.raw(f"RuntimeError: {message}")
        log.line("AsyncLLM output_handler failed.", src="async_llm.py:480", level="ERROR")
        log.raw(
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
            "(above) for the root cause."
        )

    def peer_lost(self, log: Logger, message: str) -> None:
        log.line(
            f"EngineCore encountered a fatal error. {message}", src="core.py:710", proc=CORE, level="ERROR"
        )

    def shutdown(self, log: Logger) -> None:
        log.line("Shutting down FastAPI HTTP server.", src="launcher.py:101")

    # ---- HTTP -----------------------------------------------------------------------------------------
    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}

    def bad_id(self, t: int, vocab: int) -> str:
        return f"Token id {t} is out of vocabulary"

    def empty_prompt(self) -> str:
        return "The prompt cannot be empty."

    def missing_prompt(self) -> str:
        return "Either prompt or prompt_embeds must be provided and non-empty."

    def length_error(self, n_in: int, max_new: int, ctx: int, cap: int) -> str | None:
        if n_in >= ctx:
            return (
                f"This model's maximum context length is {ctx} tokens. However, your request "
                f"has {n_in} input tokens. Please reduce the length of the input messages."
            )
        if n_in + max_new > ctx:
            return (
                f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{n_in + max_new} tokens ({n_in} in the messages, {max_new} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        if n_in + max_new > cap + 16:
            return f"The request needs {n_in + max_new} KV-cache tokens but the KV cache holds {cap} tokens."
        return None

    def routes(self, app: Any) -> dict[tuple[str, str], Any]:
        """/load always; /reset_prefix_cache and /server_info only with VLLM_SERVER_DEV_MODE=1."""
        r: dict[tuple[str, str], Any] = {
            ("GET", "/load"): lambda req, conn: Response(200, app.dumps({"server_load": len(app.e.running)}))
        }
        if app.dev_mode:
            r[("POST", "/reset_prefix_cache")] = app.reset_prefix_cache
            r[("GET", "/server_info")] = app.server_info
        return r

    def check_model(self, requested: Any, served: str) -> str | None:
        if requested is not None and requested != served:
            return f"The model `{requested}` does not exist."
        return None

    def model_card(self, card: dict[str, Any], created: int) -> dict[str, Any]:
        card["permission"] = [
            {
                "id": "modelperm-enginesim",
                "object": "model_permission",
                "created": created,
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
        return card

    def server_info(self, info: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        return {"vllm_config": info, "enginesim": out["enginesim"]}

    async def health(self, app: Any) -> Any:
        return Response(200, b"")  # the real one does not generate

    # ---- /metrics -------------------------------------------------------------------------------------
    def exposition(self, app: Any) -> str:
        return vllm_exposition(app)

    def histogram_buckets(self) -> dict[str, list[float]]:
        return {
            "ttft": VLLM_TTFT_BUCKETS,
            "itl": VLLM_ITL_BUCKETS,
            "e2e": VLLM_E2E_BUCKETS,
            "queue": VLLM_E2E_BUCKETS,
        }

    # ---- scheduler policy -----------------------------------------------------------------------------
    def plan(self, s: Scheduler) -> Plan:
        return _plan(s)

    def after_step(
        self,
        s: Scheduler,
        prefill: list[tuple[Req, int]],
        decode: list[Req],
        new_tokens: int,
        graph: bool,
        dt: float,
        now: float,
    ) -> None:
        if now - s.last_stats_wall >= 10.0 * s.scale:
            _stats_log(s, now)


FLAVOUR = VLLM()


# ---- the scheduler: one token budget per step, running requests first, recompute preemption ----------
def _plan(s: Scheduler) -> Plan:
    budget = s.cfg.chunk or 8192
    prefill: list[tuple[Req, int]] = []
    decode: list[Req] = []
    dec_tokens = 0
    dec_ctx = 0
    preempted = False
    running = s.running
    # fast path: every running request is decoding and the pool has room
    need = 0
    all_decode = True
    for r in running:
        if r.computed < r.fill_len:
            all_decode = False
            break
        need += 1 + (len(s._draft(r)) if s.spec else 0)
    if all_decode and need <= budget and s.free_tokens() >= need:
        s.private_used += need
        for r in running:
            n = 1 + len(r.draft) if s.spec else 1
            r.private += n
            dec_ctx += r.computed
        decode = list(running)
        dec_tokens = need
        budget -= need
    else:
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            if r.computed < r.fill_len:
                n = min(r.fill_len - r.computed, budget)
                is_prefill = True
            else:
                n = 1 + (len(s._draft(r)) if s.spec else 0)
                is_prefill = False
            ok = True
            while not s._alloc(n):
                victim = running.pop()
                _preempt(s, victim)
                preempted = True
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            r.private += n
            budget -= n
            if is_prefill:
                prefill.append((r, n))
            else:
                decode.append(r)
                dec_tokens += n
                dec_ctx += r.computed
            i += 1
    if not preempted:
        while s.waiting and budget > 0 and len(running) < s.max_running:
            r = s.waiting[0]
            s._admit_prefix(r)
            n = min(r.fill_len - r.computed, budget)
            if not s._alloc(n):
                s._unadmit(r)
                break
            s.waiting.popleft()
            s._mark_started(r)
            r.private += n
            running.append(r)
            prefill.append((r, n))
            budget -= n
    return prefill, decode, dec_tokens, dec_ctx


def _preempt(s: Scheduler, r: Req) -> None:
    s.stats.preemptions += 1
    s.stats.preemptions_since_log += 1
    r.retractions += 1
    s._release(r, insert=True)
    s.waiting.appendleft(r)


# ---- applying a finished step ---------------------------------------------------------------


def _stats_log(s: Scheduler, now: float) -> None:
    dt = max(now - s.last_stats_wall, 1e-9)
    st = s.stats
    q, h = st.prefix_queries, st.prefix_hits
    dq, dh = q - s.last_hit_q[0], h - s.last_hit_q[1]
    hit_rate = 100.0 * dh / dq if dq else 0.0
    s.last_hit_q = (q, h)
    pre = f", Preemptions: {st.preemptions_since_log}" if st.preemptions_since_log else ""
    st.preemptions_since_log = 0
    s.log.line(
        f"Engine 000: Avg prompt throughput: {s.prompt_tokens_since_stats / dt:.1f} tokens/s, "
        f"Avg generation throughput: {s.gen_tokens_since_stats / dt:.1f} tokens/s, "
        f"Running: {len(s.running)} reqs, Waiting: {len(s.waiting)} reqs{pre}, "
        f"GPU KV cache usage: {100.0 * s.token_usage():.1f}%, Prefix cache hit rate: {hit_rate:.1f}%",
        src="loggers.py:123",
        proc="APIServer",
    )
    if s.spec and st.spec_drafts:
        acc = st.spec_accepted / max(st.spec_draft_tokens, 1)
        per_pos = ", ".join(f"{st.spec_per_pos[i] / st.spec_drafts:.3f}" for i in range(s.n_drafts))
        s.log.line(
            f"SpecDecoding metrics: Mean acceptance length: {1 + st.spec_accepted / st.spec_drafts:.2f}, "
            f"Accepted throughput: {st.spec_accepted / dt:.2f} tokens/s, "
            f"Drafted throughput: {st.spec_draft_tokens / dt:.2f} tokens/s, "
            f"Accepted: {st.spec_accepted} tokens, "
            f"Drafted: {st.spec_draft_tokens} tokens, Per-position acceptance rate: {per_pos}, "
            f"Avg Draft acceptance rate: {100 * acc:.1f}%",
            src="metrics.py:96",
            proc="APIServer",
        )
    s.prompt_tokens_since_stats = 0
    s.gen_tokens_since_stats = 0
    s.last_stats_wall = now
