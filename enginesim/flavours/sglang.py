"""SGLang 0.5.6 as the emulator speaks it: `python -m sglang.launch_server` flags, `[time TPn] msg` log
lines, the native /generate surface and its error bodies, the `sglang:*` metrics, and its scheduler
(a prefill batch runs instead of decode; admission against a decaying new-token ratio; retraction when
decode runs out of KV). enginesim/README.md describes each; this file is the one place they live.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from .. import catalog, disagg_flags, engine_versions
from ..capacity import GB, Capacity, StartupOOM
from ..cli import Config, add_sim_flags, check_dist, check_model, kv_bytes, positive, sim_knobs
from ..metrics import (
    SGL_E2E_BUCKETS,
    SGL_ITL_BUCKETS,
    SGL_QUEUE_BUCKETS,
    SGL_TTFT_BUCKETS,
    sglang_exposition,
)
from .base import Flavour

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from ..catalog import Hardware, ModelSpec
    from ..logs import Logger
    from ..scheduler import Req, Scheduler

Plan = tuple[list[tuple["Req", int]], list["Req"], int, int]
KV_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
DEFAULT_MEM_FRACTION = 0.836  # the auto value SGLang reports on a 141 GB H200 (2026 /server_info)
CLIP_MAX_NEW_TOKENS = 4096  # SGLang's admission estimate clips max_new_tokens here
RETRACT_DECODE_STEPS = 20  # SGLang retracts until every remaining request has room for this many steps
ERROR_TYPES = {400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}


class SGLang(Flavour):
    name = "sglang"
    title = "SGLang"
    version = "0.5.6"
    argv_head = ("sglang",)
    owned_by = "sglang"
    prefill_joins_running = True
    decode_kv_at_apply = True
    drafts_at_verify = True
    min_max_tokens = 0
    dead_status = 500

    # ---- flags --------------------------------------------------------------------------------------
    def parser(self, version: str | None = None) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
        a = p.add_argument
        a("--model-path", "--model", required=True)
        a("--tokenizer-path")
        a("--served-model-name")
        a("--host", default="127.0.0.1")
        a("--port", type=int, default=30000)
        a("--mem-fraction-static", type=float)
        a("--context-length", type=int)
        a("--max-running-requests", type=positive("max-running-requests"))
        a("--max-queued-requests", type=int)
        a("--chunked-prefill-size", type=int)
        a("--max-prefill-tokens", type=int, default=16384)
        a("--enable-mixed-chunk", action="store_true")
        a("--attention-backend")
        a("--prefill-attention-backend")
        a("--decode-attention-backend")
        a("--sampling-backend")
        a("--enable-metrics", action="store_true")
        a("--enable-metrics-for-all-schedulers", action="store_true")
        a("--enable-cache-report", action="store_true")
        engine_versions.add_sglang_cuda_graph_flags(a, version or engine_versions.default("sglang"))
        a("--disable-cuda-graph", action="store_true")
        a("--disable-cuda-graph-padding", action="store_true")
        a("--max-total-tokens", type=positive("max-total-tokens"))
        a("--disable-radix-cache", action="store_true")
        a("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
        a("--speculative-num-draft-tokens", type=int)
        a("--speculative-num-steps", type=int)
        a("--speculative-eagle-topk", type=int)
        a("--speculative-draft-model-path")
        a("--speculative-ngram-min-match-window-size", type=int, default=1)
        a("--speculative-ngram-max-match-window-size", type=int, default=12)
        a("--speculative-ngram-min-bfs-breadth", type=int)
        a("--speculative-ngram-max-bfs-breadth", type=int)
        a("--speculative-ngram-match-type", choices=["BFS", "PROB"])
        a("--speculative-ngram-branch-length", type=int)
        a("--speculative-ngram-capacity", type=int)
        a("--speculative-ngram-max-trie-depth", type=int)
        a("--tp-size", "--tensor-parallel-size", "--tp", type=positive("tp-size"), default=1)
        a("--ep-size", "--expert-parallel-size", "--ep", type=positive("ep-size"), default=1)
        a("--dp-size", "--data-parallel-size", "--dp", type=int, default=1)
        a("--load-balance-method", choices=["round_robin", "shortest_queue"], default="round_robin")
        a("--pp-size", "--pipeline-parallel-size", type=int, default=1)
        a("--nnodes", type=positive("nnodes"), default=1)
        a("--node-rank", type=int, default=0)
        a("--dist-init-addr", "--nccl-init-addr")
        a("--dist-timeout", type=int)
        a("--nccl-port", type=int)
        a("--kv-cache-dtype", choices=KV_DTYPES, default="auto")
        a("--dtype", default="auto")
        a("--quantization")
        a("--trust-remote-code", action="store_true")
        a("--tokenizer-mode", default="auto")
        a("--skip-tokenizer-init", action="store_true")
        a("--load-format", default="auto")
        a("--revision")
        a("--page-size", type=positive("page-size"), default=1)
        a("--schedule-policy", default="fcfs")
        a("--schedule-conservativeness", type=float, default=1.0)
        a("--decode-log-interval", type=positive("decode-log-interval"), default=40)
        a("--stream-interval", type=positive("stream-interval"), default=1)
        a("--incremental-streaming-output", action="store_true")
        a("--disable-overlap-schedule", action="store_true")
        a("--enable-dp-attention", action="store_true")
        a("--enable-ep-moe", action="store_true")
        a("--moe-a2a-backend")
        a("--moe-runner-backend")
        a("--enable-two-batch-overlap", action="store_true")
        a("--disable-custom-all-reduce", action="store_true")
        a("--enable-torch-compile", action="store_true")
        a("--torch-compile-max-bs", type=int)
        a("--random-seed", type=int)
        a("--watchdog-timeout", type=float)
        a("--log-level", default="info")
        a("--log-level-http")
        a("--log-requests", action="store_true")
        a("--log-requests-level", type=int)
        a("--show-time-cost", action="store_true")
        a("--skip-server-warmup", action="store_true")
        a("--warmups")
        a("--device", default="cuda")
        a("--base-gpu-id", type=int, default=0)
        a("--chat-template")
        a("--reasoning-parser")
        a("--tool-call-parser")
        a("--api-key")
        a("--retraction-policy", choices=["length", "priority"])
        a("--collect-tokens-histogram", action="store_true")
        a("--enable-deterministic-inference", action="store_true")
        a("--sleep-on-idle", action="store_true")
        a("--model-loader-extra-config")
        a("--weight-version", default="default")
        disagg_flags.add_sglang(a)
        add_sim_flags(p)
        return p

    def config(
        self, p: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], env: dict[str, str]
    ) -> Config:
        model = check_model(p, "--model-path", ns.model_path)
        sim = sim_knobs(ns, env, p.error)
        if ns.mem_fraction_static is not None and not 0 < ns.mem_fraction_static < 1:
            p.error(f"argument --mem-fraction-static: {ns.mem_fraction_static} must be in (0, 1)")
        check_dist(p, ns.nnodes, ns.node_rank, ns.dist_init_addr, "--dist-init-addr")
        if ns.tp_size % ns.nnodes:
            p.error(f"argument --tp-size: {ns.tp_size} must be divisible by --nnodes={ns.nnodes}")
        chunk = ns.chunked_prefill_size
        if chunk is None:
            chunk = 8192 if catalog.load_hardware(sim.hardware, sim.hw_override).mem_bytes >= 60e9 else 2048
        if chunk == 0 or chunk < -1:
            p.error(f"argument --chunked-prefill-size: {chunk} must be -1 (disabled) or > 0")
        spec = ns.speculative_algorithm
        if spec not in (None, "NGRAM"):
            p.error(
                f"argument --speculative-algorithm: {spec} needs a draft model; enginesim emulates NGRAM only"
            )
        n_draft = ns.speculative_num_draft_tokens or (12 if spec else 0)
        if spec and n_draft < 2:
            p.error(f"argument --speculative-num-draft-tokens: {n_draft} must be >= 2")
        graph = not ns.disable_cuda_graph and getattr(ns, "cuda_graph_backend_decode", None) != "disabled"
        return Config(
            flavour="sglang",
            argv=argv,
            model_path=ns.model_path,
            served_model_name=ns.served_model_name or ns.model_path,
            host=ns.host,
            port=ns.port,
            mem_fraction=ns.mem_fraction_static,
            context_length=ns.context_length,
            max_running=ns.max_running_requests,
            chunk=None if chunk == -1 else chunk,
            max_prefill_tokens=ns.max_prefill_tokens,
            mixed_chunk=ns.enable_mixed_chunk,
            enable_metrics=ns.enable_metrics,
            cuda_graph=graph,
            cuda_graph_max_bs=ns.cuda_graph_max_bs or (max(ns.cuda_graph_bs) if ns.cuda_graph_bs else 256),
            max_total_tokens=ns.max_total_tokens,
            num_gpu_blocks_override=None,
            prefix_cache=not ns.disable_radix_cache,
            page_size=ns.page_size,
            spec_algorithm=spec,
            spec_num_draft_tokens=n_draft,
            spec_min_match=ns.speculative_ngram_min_match_window_size,
            spec_max_match=ns.speculative_ngram_max_match_window_size,
            tp=ns.tp_size,
            ep=ns.ep_size,
            nnodes=ns.nnodes,
            node_rank=ns.node_rank,
            dist_init_addr=ns.dist_init_addr,
            kv_cache_dtype=ns.kv_cache_dtype,
            kv_dtype_bytes=kv_bytes(ns.kv_cache_dtype, model.dtype_bytes),
            scheduling_policy=ns.schedule_policy,
            decode_log_interval=ns.decode_log_interval,
            stream_interval=ns.stream_interval,
            sim=sim,
            raw=vars(ns),
        )

    def prefill_graph_max_tokens(self, cfg: Config) -> int:
        """Extend (prefill and mixed) batches under prefill CUDA graphs, by version.

        0.5.6 runs them eagerly (piecewise prefill graphs were opt-in through a flag enginesim does not
        take, sgl-project/sglang PR #10062). From the CUDA-graph runner refactor (PR #23906; RFC #23004:
        "enable breakable cuda graph for prefill by default") prefill has its own backend, breakable by
        default, captured in token buckets up to --cuda-graph-max-bs-prefill (else the chunk size);
        `--cuda-graph-backend-prefill disabled` runs prefill eagerly. --disable-cuda-graph turns off the
        decode graphs only (a maintainer's reading in PR #25795), so it leaves prefill graphs alone.
        """
        raw = cfg.raw
        if "cuda_graph_backend_prefill" not in raw or raw["cuda_graph_backend_prefill"] == "disabled":
            return 0
        if raw.get("cuda_graph_max_bs_prefill"):
            return int(raw["cuda_graph_max_bs_prefill"])
        if raw.get("cuda_graph_bs_prefill"):
            return max(raw["cuda_graph_bs_prefill"])
        return cfg.chunk or cfg.max_prefill_tokens or 8192

    # ---- KV capacity ----------------------------------------------------------------------------------
    def capacity(self, cfg: Config, model: ModelSpec, hw: Hardware) -> Capacity:
        """tokens = (mem x mem_fraction_static - weights/tp) / bytes per token, capped by
        --max-total-tokens; the `KV Cache is allocated` lines."""
        tp = cfg.tp
        kv_bpt = model.kv_bytes_per_token(cfg.kv_dtype_bytes, tp)
        weights = model.weight_bytes_per_gpu(tp)
        total = hw.mem_bytes
        ctx = cfg.context_length or model.context
        dtype = "torch.float8_e4m3fn" if model.dtype_bytes == 1 else "torch.bfloat16"
        lines: list[str] = []
        frac = cfg.mem_fraction or DEFAULT_MEM_FRACTION
        avail_after_w = (total - weights) / GB
        lines.append(
            f"Load weight end. type={model.architecture}, dtype={dtype}, "
            f"avail mem={avail_after_w:.2f} GB, mem usage={weights / GB:.2f} GB."
        )
        kv_mem = total * frac - weights
        if kv_mem <= 0:
            raise StartupOOM("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        tokens = int(kv_mem // kv_bpt)
        if cfg.max_total_tokens:
            tokens = min(tokens, cfg.max_total_tokens)
        kv_bytes = tokens * kv_bpt
        if model.mla:
            lines.append(f"KV Cache is allocated. #tokens: {tokens}, KV size: {kv_bytes / GB:.2f} GB")
        else:
            lines.append(
                f"KV Cache is allocated. #tokens: {tokens}, K size: {kv_bytes / 2 / GB:.2f} GB, "
                f"V size: {kv_bytes / 2 / GB:.2f} GB"
            )
        avail_after_kv = (total - weights - kv_bytes) / GB
        lines.append(f"Memory pool end. avail mem={avail_after_kv:.2f} GB")
        pool_reqs = min(max(int(tokens / ctx * 512), 2048), 4096)
        max_running = cfg.max_running or min(max(tokens // 2, 1), pool_reqs)
        chunk = cfg.chunk if cfg.chunk else -1
        lines.append(
            f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, "
            f"max_prefill_tokens={cfg.max_prefill_tokens}, max_running_requests={max_running}, "
            f"context_len={ctx}, available_gpu_mem={max(avail_after_kv - 0.5, 0.01):.2f} GB"
        )
        return Capacity(tokens, kv_bpt, weights, kv_bytes, ctx, max_running, 0, lines)

    def mem_fraction(self, cfg: Config) -> float:
        return cfg.mem_fraction or DEFAULT_MEM_FRACTION

    # ---- log lines ----------------------------------------------------------------------------------
    def format(self, msg: str, level: str, rank_suffix: str, pid: int, src: str, proc: str) -> str:
        """`[2026-06-08 19:59:37] msg`; scheduler (TP) lines add ` TP0`, ` TP8` ... when TP > 1."""
        del level, pid, src, proc
        return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{rank_suffix}] {msg}"

    def preamble(self, cfg: Config, log: Logger, model: ModelSpec, hw: Hardware) -> None:
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.raw.items() if not k.startswith("sim_"))
        log.line(f"server_args=ServerArgs({args})")
        if not cfg.raw.get("attention_backend"):
            log.line("Attention backend not specified. Use fa3 backend by default.")
        log.line("Init torch distributed begin.", rank=True)
        log.line("Init torch distributed ends. mem usage=0.00 GB", rank=True)
        log.line(f"Load weight begin. avail mem={hw.mem_bytes / (1 << 30):.2f} GB", rank=True)

    def capacity_line(self, log: Logger, line: str) -> None:
        log.line(line, rank=True)

    def graph_lines(self, log: Logger) -> None:
        log.line(
            "Capture cuda graph begin. This can take up to several minutes. avail mem=12.00 GB", rank=True
        )
        log.line(
            "Capture cuda graph end. Time elapsed: 1.02 s. mem usage=0.06 GB. avail mem=11.94 GB.", rank=True
        )

    def ready_lines(self, cfg: Config, log: Logger) -> None:
        url = f"http://{cfg.host}:{cfg.port}"
        log.raw(f"INFO:     Started server process [{os.getpid()}]")
        log.raw("INFO:     Waiting for application startup.")
        log.raw("INFO:     Application startup complete.")
        log.raw(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
        log.line("The server is fired up and ready to roll!")

    def startup_failure(self, log: Logger, message: str) -> None:
        log.line("Scheduler hit an exception: Traceback (most recent call last):", rank=True)
        log.raw(
            '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 412, '
            "in load_model"
        )
        log.raw(message)
        log.line("Received sigquit from a child process. It usually means the child failed.")

    def fatal(self, log: Logger, message: str) -> None:
        log.line("Scheduler hit an exception: Traceback (most recent call last):", rank=True)
        log.raw(f"RuntimeError: {message}")
        log.line("Received sigquit from a child process. It usually means the child failed.")

    def peer_lost(self, log: Logger, message: str) -> None:
        log.line(f"Scheduler hit an exception: torch.distributed.DistBackendError: {message}", rank=True)

    def shutdown(self, log: Logger) -> None:
        log.line("Received signal, shutting down.")

    # ---- HTTP -----------------------------------------------------------------------------------------
    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        del kind
        return {
            "object": "error",
            "message": message,
            "type": ERROR_TYPES.get(status, "Bad Request"),
            "param": None,
            "code": status,
        }

    def bad_id(self, t: int, vocab: int) -> str:
        return f"Input token id {t} is out of vocabulary range [0, {vocab})."

    def empty_prompt(self) -> str:
        return "Input is empty."

    def missing_prompt(self) -> str:
        return "prompt is required"

    def length_error(self, n_in: int, max_new: int, ctx: int, cap: int) -> str | None:
        max_input = min(ctx - 1, cap - 1)
        if n_in >= ctx:
            return f"The input ({n_in} tokens) is longer than the model's context length ({ctx} tokens)."
        if n_in > max_input:
            return (
                f"Input length ({n_in} tokens) exceeds the maximum allowed length "
                f"({max_input} tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        if n_in + max_new > ctx:
            return (
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n_in + max_new} tokens: {n_in} tokens from "
                f"the input messages and {max_new} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the "
                "limit."
            )
        return None

    def routes(self, app: Any) -> dict[tuple[str, str], Any]:
        """The native surface (routes_native.py)."""
        from .. import routes_native

        return routes_native.sglang_routes(app)

    def serves_metrics(self, cfg: Config) -> bool:
        return cfg.enable_metrics  # SGLang's /metrics exists only with --enable-metrics

    async def health(self, app: Any) -> Any:
        """A 1-token generation, answered as soon as the scheduler shows progress."""
        from .. import routes_native

        return await routes_native.health_generate(app)

    def choice_extras(self, choice: dict[str, Any], r: Req) -> None:
        choice["matched_stop"] = (r.finish_reason or {}).get("matched")

    def usage_in_last_chunk(self) -> bool:
        return True

    # ---- /metrics -------------------------------------------------------------------------------------
    def exposition(self, app: Any) -> str:
        return sglang_exposition(app)

    def histogram_buckets(self) -> dict[str, list[float]]:
        return {
            "ttft": SGL_TTFT_BUCKETS,
            "itl": SGL_ITL_BUCKETS,
            "e2e": SGL_E2E_BUCKETS,
            "queue": SGL_QUEUE_BUCKETS,
        }

    # ---- scheduler policy -----------------------------------------------------------------------------
    def plan(self, s: Scheduler) -> Plan:
        return _plan(s)

    def proposed_drafts(self, s: Scheduler, draft: list[int]) -> int:
        return s.n_drafts

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
        if prefill:
            _prefill_log(s, prefill, new_tokens, dt)
        if decode:
            s.decode_steps_since_log += 1
            if s.decode_steps_since_log >= s.cfg.decode_log_interval:
                _decode_log(s, graph, now)


FLAVOUR = SGLang()


# ---- the scheduler: prefill batches, admission, retraction ------------------------------------------
def _plan(s: Scheduler) -> Plan:
    cfg = s.cfg
    prefill: list[tuple[Req, int]] = []
    if s.waiting or s.chunked is not None:
        prefill = _prefill(s)
    decode: list[Req] = []
    if s.running and (not prefill or cfg.mixed_chunk):
        _check_decode_mem(s)
        decode = s.running
        s.ratio = max(s.min_ratio, s.ratio - s.ratio_decay)
    per = 1 + s.n_drafts if s.spec else 1
    dec_ctx = 0
    for r in decode:
        dec_ctx += r.computed
    return prefill, list(decode), len(decode) * per, dec_ctx


def _prefill(s: Scheduler) -> list[tuple[Req, int]]:
    cfg = s.cfg
    chunk = cfg.chunk
    budget = chunk if chunk else cfg.max_prefill_tokens
    if cfg.mixed_chunk and s.running:
        budget = max(1, budget - len(s.running))
    items: list[tuple[Req, int]] = []
    r = s.chunked
    if r is not None:
        # the chunked request continues first; waiting requests may join if budget is left
        left = r.fill_len - r.computed
        n = min(left, budget) if chunk else left
        if not s._alloc(n):
            return items
        r.private += n
        items.append((r, n))
        budget -= n
        if n < left or budget <= 0:
            return items
    avail = s.available()
    reserve = 0.0
    for q in s.running:
        reserve += min(q.max_new - q.out_len, CLIP_MAX_NEW_TOKENS) * s.ratio
    rem_total = avail - reserve
    n_running = len(s.running)
    while s.waiting and budget > 0 and n_running + len(items) < s.max_running:
        r = s.waiting[0]
        s._admit_prefix(r)
        extend = r.fill_len - r.computed
        need = extend + min(r.max_new - r.out_len, CLIP_MAX_NEW_TOKENS) * s.ratio
        first = not items and not s.running
        if need > rem_total and not (first and extend <= avail):
            s._unadmit(r)
            break
        if chunk:
            n = min(extend, budget)
        else:
            if extend > budget and items:
                s._unadmit(r)
                break
            n = extend
        if not s._alloc(n):
            s._unadmit(r)
            break
        s.waiting.popleft()
        s._mark_started(r)
        r.private += n
        s._new_cached += r.prefix_len
        items.append((r, n))
        rem_total -= need
        budget -= n
        if n < extend:
            s.chunked = r
            break
    return items


def _check_decode_mem(s: Scheduler) -> None:
    per = 1 + s.n_drafts if s.spec else 1
    if s.available() >= len(s.running) * per:
        return
    order = sorted(s.running, key=lambda q: (q.out_len, -q.prompt_len), reverse=True)
    retracted: list[Req] = []
    gained = 0
    while len(order) > 1 and s.available() < max(len(order) * RETRACT_DECODE_STEPS, len(order) * per):
        victim = order.pop()
        gained += victim.private
        _retract(s, victim)
        retracted.append(victim)
    if not retracted:
        return
    s.running = [q for q in s.running if q not in retracted]
    old = s.ratio
    total_decoded = sum(q.out_len for q in s.running)
    total_max_new = sum(q.max_new for q in s.running) or 1
    s.ratio = min(1.0, (total_decoded + RETRACT_DECODE_STEPS * len(s.running)) / total_max_new)
    s.log.warning(
        f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
        f"#new_tokens_gained: {gained}, #new_token_ratio: {old:.4f} -> {s.ratio:.4f}",
        rank=True,
    )


def _retract(s: Scheduler, r: Req) -> None:
    st = s.stats
    st.retracted_reqs += 1
    st.retracted_since_log += 1
    st.retracted_in += r.prompt_len
    st.retracted_out += r.out_len
    r.retractions += 1
    s._release(r, insert=False)
    s.waiting.appendleft(r)


def _prefill_log(s: Scheduler, prefill: list[tuple[Req, int]], new_tok: int, dt: float) -> None:
    hit = s._new_cached
    s._new_cached = 0
    n_new_done = sum(1 for r, _ in prefill if r.computed >= r.fill_len and not r.finished)
    s.stats.cache_hit_rate = hit / (hit + new_tok) if hit + new_tok else 0.0
    pending = (s.chunked.fill_len - s.chunked.computed) if s.chunked else 0
    s.log.line(
        f"Prefill batch, #new-seq: {len(prefill)}, #new-token: {new_tok}, #cached-token: {hit}, "
        f"token usage: {s.token_usage():.2f}, #running-req: {max(len(s.running) - n_new_done, 0)}, "
        f"#queue-req: {len(s.waiting)}, #pending-token: {pending}, cuda graph: False, "
        f"input throughput (token/s): {new_tok / max(dt * s.scale, 1e-9):.2f}",
        rank=True,
    )


def _decode_log(s: Scheduler, graph: bool, now: float) -> None:
    thr = s.gen_tokens_since_log / max(now - s.last_decode_log, 1e-9)
    s.stats.last_gen_throughput = thr
    spec = ""
    st = s.stats
    if s.spec and st.spec_verify:
        spec = (
            f"accept len: {st.spec_emitted / st.spec_verify:.2f}, "
            f"accept rate: {st.spec_accepted / max(st.spec_verify * s.n_drafts, 1):.2f}, "
        )
    s.log.line(
        f"Decode batch, #running-req: {len(s.running)}, #token: {s.used_tokens()}, "
        f"token usage: {s.token_usage():.2f}, {spec}cuda graph: {graph}, "
        f"gen throughput (token/s): {thr:.2f}, #queue-req: {len(s.waiting)}, ",
        rank=True,
    )
    s.decode_steps_since_log = 0
    s.gen_tokens_since_log = 0
    s.last_decode_log = now
