"""The continuous-batching scheduler (SGLang and vLLM flavours): KV pool, prefix cache, batch plans.

Why: the effects quickmap measures (queueing, prefix hits, chunked-prefill interference, KV pressure,
CUDA graphs, speculative decoding) must emerge from scheduling real requests against a finite KV pool
and a cost model, not be dialled in. This module holds no clock and no I/O: a driver asks for a plan,
prices it with the cost model, and applies it at the step's end time. The live server (engine.py)
drives it against the wall clock and the replay (replay.py) in pure virtual time, so both run the very
same scheduling code.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Protocol

from . import lm
from .capacity import Capacity
from .catalog import Hardware, ModelSpec
from .cli import Config
from .costmodel import CostModel
from .logs import Logger
from .metrics import (
    SGL_E2E_BUCKETS,
    SGL_ITL_BUCKETS,
    SGL_QUEUE_BUCKETS,
    SGL_TTFT_BUCKETS,
    VLLM_E2E_BUCKETS,
    VLLM_ITER_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_TTFT_BUCKETS,
    Histogram,
)
from .radix import RadixCache

CLIP_MAX_NEW_TOKENS = 4096  # SGLang's admission estimate clips max_new_tokens here
RETRACT_DECODE_STEPS = 20  # SGLang retracts until every remaining request has room for this many steps


def build_cost(cfg: Config, model: ModelSpec, hw: Hardware, cap: Capacity) -> CostModel:
    """The cost model of one engine configuration (the live server and the replay build it here)."""
    return CostModel(
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


class Sink(Protocol):
    def emit(self, req: Req, finished: bool) -> None: ...
    def fail(self, req: Req, message: str) -> None: ...


class Req:
    """One generation request inside the engine."""

    __slots__ = (
        "accepted",
        "arrival",
        "cached_tokens",
        "computed",
        "ctx",
        "draft",
        "drafter",
        "e2e",
        "fill_len",
        "finish_reason",
        "finished",
        "first_token",
        "health",
        "hist",
        "ignore_eos",
        "last_emit",
        "lm",
        "mark",
        "max_new",
        "natural_len",
        "node",
        "out_start",
        "prefix_len",
        "private",
        "prompt_len",
        "proposed",
        "queue_time",
        "queued_at",
        "retractions",
        "rid",
        "sink",
        "stop_ids",
        "verify_ct",
    )

    def __init__(
        self,
        rid: str,
        prompt: list[int],
        max_new: int,
        ignore_eos: bool,
        sink: Sink,
        stop_ids: frozenset[int] = frozenset(),
        health: bool = False,
    ) -> None:
        self.rid = rid
        self.ctx = list(prompt)
        self.prompt_len = len(prompt)
        self.max_new = max_new
        self.ignore_eos = ignore_eos
        self.stop_ids = stop_ids
        self.sink = sink
        self.arrival = 0.0  # set by Scheduler.submit from the driver's clock
        self.queued_at = 0.0
        self.queue_time: float | None = None
        self.first_token: float | None = None
        self.last_emit = 0.0
        self.e2e = 0.0
        self.cached_tokens = 0
        self.computed = 0
        self.fill_len = 0
        self.prefix_len = 0
        self.private = 0
        self.node: Any = None
        self.retractions = 0
        self.finished = False
        self.finish_reason: dict[str, Any] | None = None
        self.lm: lm.EmulatedLM | None = None
        self.drafter: lm.NgramDrafter | None = None
        self.draft: list[int] = []
        self.natural_len = 1 << 30
        self.verify_ct = 0
        self.accepted = 0
        self.proposed = 0
        self.hist: list[int] = []
        self.out_start = self.prompt_len
        self.health = health
        self.mark = 0.0  # the driver's: the live engine keeps its slip total at arrival here

    @property
    def out_len(self) -> int:
        return len(self.ctx) - self.prompt_len


class Stats:
    """Counters and histograms behind /metrics, the periodic log lines and /server_info."""

    def __init__(self, flavour: str) -> None:
        sgl = flavour == "sglang"
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.aborted = 0
        self.finished_by_reason: collections.Counter[str] = collections.Counter()
        self.retracted_reqs = 0
        self.retracted_in = 0
        self.retracted_out = 0
        self.retracted_since_log = 0
        self.preemptions = 0
        self.preemptions_since_log = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_verify = 0
        self.spec_emitted = 0
        self.spec_per_pos: collections.Counter[int] = collections.Counter()
        self.graph_passes: collections.Counter[str] = collections.Counter()
        self.realtime_tokens: collections.Counter[str] = collections.Counter()
        self.ttft = Histogram(SGL_TTFT_BUCKETS if sgl else VLLM_TTFT_BUCKETS)
        self.itl = Histogram(SGL_ITL_BUCKETS if sgl else VLLM_ITL_BUCKETS)
        self.e2e = Histogram(SGL_E2E_BUCKETS if sgl else VLLM_E2E_BUCKETS)
        self.queue = Histogram(SGL_QUEUE_BUCKETS if sgl else VLLM_E2E_BUCKETS)
        self.iter_tokens = Histogram(VLLM_ITER_BUCKETS)
        self.retractions_hist = Histogram([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100])
        self.steps = 0
        self.events = 0
        self.last_gen_throughput = 0.0
        self.cache_hit_rate = 0.0


class Scheduler:
    """The scheduler + KV pool + prefix cache of one engine (the head rank's view of all GPUs).

    `clock` gives "now" for the request timings it records (queue time, TTFT, ITL, E2E histograms):
    wall seconds in the live server, virtual seconds in the replay. `scale` converts a step's
    emulated duration into the clock's unit for the throughput printed in log lines.
    """

    def __init__(
        self,
        cfg: Config,
        model: ModelSpec,
        cap: Capacity,
        cost: CostModel,
        log: Logger,
        clock: Callable[[], float],
        scale: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.cap = cap
        self.cost = cost
        self.log = log
        self.sgl = cfg.flavour == "sglang"
        self.capacity = cap.tokens
        self.max_running = cap.max_running
        self.clock = clock
        self.scale = scale
        self.tree = RadixCache(cfg.page_size) if cfg.prefix_cache else None
        self._new_cached = 0
        self.private_used = 0
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.chunked: Req | None = None  # SGLang: the one request whose prefill is split over steps
        self.stats = Stats(cfg.flavour)
        self.spec = cfg.spec_algorithm == "NGRAM"
        self.n_drafts = max(0, cfg.spec_num_draft_tokens - 1)
        init_ratio = min(0.7 * float(cfg.raw.get("schedule_conservativeness") or 1.0), 1.0)
        self.init_ratio = init_ratio
        self.min_ratio = min(init_ratio * 0.14, init_ratio)
        self.ratio = init_ratio
        self.ratio_decay = (init_ratio - self.min_ratio) / 600
        self.completed = 0
        self.submitted = 0
        self.decode_steps_since_log = 0
        self.gen_tokens_since_log = 0
        now = clock()
        self.last_decode_log = now
        self.prompt_tokens_since_stats = 0
        self.gen_tokens_since_stats = 0
        self.last_stats_wall = now
        self.last_hit_q = (0, 0)
        self.salt = cfg.sim.seed
        self.last_finished = 0  # requests the last applied step finished (closed-loop clients refill)
        self.last_first_tokens: list[Req] = []  # requests whose first token the last applied step made

    # ---- KV pool -------------------------------------------------------------------------------
    def free_tokens(self) -> int:
        return self.capacity - self.private_used - (self.tree.total if self.tree else 0)

    def available(self) -> int:
        return self.free_tokens() + (self.tree.evictable if self.tree else 0)

    def used_tokens(self) -> int:
        return self.private_used + (self.tree.protected if self.tree else 0)

    def _alloc(self, n: int) -> bool:
        free = self.free_tokens()
        if free < n:
            if not self.tree or free + self.tree.evictable < n:
                return False
            self.tree.evict(n - free)
            if self.free_tokens() < n:
                return False
        self.private_used += n
        return True

    def _release(self, r: Req, insert: bool) -> None:
        """Give back a request's KV; with a prefix cache, keep its tokens as evictable cache."""
        if self.tree is not None:
            if insert and r.computed:
                self.tree.insert(r.ctx[: r.computed])
            if r.node is not None:
                self.tree.unlock(r.node)
        self.private_used -= r.private
        r.private = 0
        r.node = None
        r.prefix_len = 0
        r.computed = 0

    # ---- requests in and out ---------------------------------------------------------------------
    def submit(self, r: Req) -> None:
        r.arrival = r.queued_at = self.clock()
        # The emulated model is built at the request's first token (_model): its prompt analysis costs
        # ~0.17 us per prompt token, which a burst of arrivals would otherwise pay in the event loop
        # ahead of the first step. The first token comes before the prompt grows, so it is the same.
        if self.spec:
            r.drafter = lm.NgramDrafter(r.ctx, self.cfg.spec_min_match, self.cfg.spec_max_match)
        self.submitted += 1
        if not r.health:
            self.stats.requests += 1
        self.waiting.append(r)
        self._on_submit(r)
        self._notify()

    def _on_submit(self, r: Req) -> None:
        """Called for every submitted request (the live engine marks its slip total there)."""

    def _notify(self) -> None:
        """A request arrived or one finished: the driver may have work to schedule."""

    def _on_finish(self) -> None:
        """Called after every finished request (the live server's fault injection hooks in here)."""

    def abort(self, r: Req) -> None:
        """Client went away: drop the request wherever it is and free its KV."""
        if r.finished:
            return
        r.finished = True
        r.finish_reason = {"type": "abort", "message": "client disconnected"}
        self.stats.aborted += 1
        if r in self.waiting:
            self.waiting.remove(r)
        if self.chunked is r:
            self.chunked = None
        if r in self.running:
            self.running.remove(r)
        self._release(r, insert=False)

    def idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked is None

    def flush_cache(self) -> bool:
        if not self.idle():
            self.log.warning(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {len(self.waiting)}, #running-req: {len(self.running)}"
            )
            return False
        if self.tree is not None:
            self.tree.reset()
        self.log.info("Cache flushed successfully!")
        return True

    def fail_all(self, message: str) -> None:
        for r in list(self.waiting) + list(self.running):
            if not r.finished:
                r.finished = True
                r.finish_reason = {"type": "abort", "message": message}
                r.sink.fail(r, message)
        self.waiting.clear()
        self.running.clear()
        self.chunked = None

    # ---- one step ----------------------------------------------------------------------------------------
    def plan(self) -> tuple[list[tuple[Req, int]], list[Req], int, int]:
        """The next batch: (prefill chunks, decode requests, decode tokens, decode context sum)."""
        return self.sgl_plan() if self.sgl else self.vllm_plan()

    # ---- SGLang scheduling ------------------------------------------------------------------------
    def _admit_prefix(self, r: Req) -> None:
        r.fill_len = len(r.ctx)
        if self.tree is not None:
            n, node = self.tree.match(r.ctx[: r.fill_len - 1])
            self.tree.lock(node)
            r.node = node
            r.prefix_len = n
            self.stats.prefix_queries += r.fill_len
            self.stats.prefix_hits += n
        r.computed = r.prefix_len

    def _unadmit(self, r: Req) -> None:
        if self.tree is not None and r.node is not None:
            self.tree.unlock(r.node)
            if r.prefix_len:
                self.stats.prefix_queries -= r.fill_len
                self.stats.prefix_hits -= r.prefix_len
        r.node = None
        r.prefix_len = 0
        r.computed = 0

    def _mark_started(self, r: Req) -> None:
        if r.queue_time is None:
            r.queue_time = self.clock() - r.queued_at
            if not r.health:
                self.stats.queue.observe(r.queue_time)
        r.cached_tokens += r.prefix_len

    def sgl_plan(self) -> tuple[list[tuple[Req, int]], list[Req], int, int]:
        cfg = self.cfg
        prefill: list[tuple[Req, int]] = []
        if self.waiting or self.chunked is not None:
            prefill = self._sgl_prefill()
        decode: list[Req] = []
        if self.running and (not prefill or cfg.mixed_chunk):
            self._sgl_check_decode_mem()
            decode = self.running
            self.ratio = max(self.min_ratio, self.ratio - self.ratio_decay)
        per = 1 + self.n_drafts if self.spec else 1
        dec_ctx = 0
        for r in decode:
            dec_ctx += r.computed
        return prefill, list(decode), len(decode) * per, dec_ctx

    def _sgl_prefill(self) -> list[tuple[Req, int]]:
        cfg = self.cfg
        chunk = cfg.chunk
        budget = chunk if chunk else cfg.max_prefill_tokens
        if cfg.mixed_chunk and self.running:
            budget = max(1, budget - len(self.running))
        items: list[tuple[Req, int]] = []
        r = self.chunked
        if r is not None:
            # the chunked request continues first; waiting requests may join if budget is left
            left = r.fill_len - r.computed
            n = min(left, budget) if chunk else left
            if not self._alloc(n):
                return items
            r.private += n
            items.append((r, n))
            budget -= n
            if n < left or budget <= 0:
                return items
        avail = self.available()
        reserve = 0.0
        for q in self.running:
            reserve += min(q.max_new - q.out_len, CLIP_MAX_NEW_TOKENS) * self.ratio
        rem_total = avail - reserve
        n_running = len(self.running)
        while self.waiting and budget > 0 and n_running + len(items) < self.max_running:
            r = self.waiting[0]
            self._admit_prefix(r)
            extend = r.fill_len - r.computed
            need = extend + min(r.max_new - r.out_len, CLIP_MAX_NEW_TOKENS) * self.ratio
            first = not items and not self.running
            if need > rem_total and not (first and extend <= avail):
                self._unadmit(r)
                break
            if chunk:
                n = min(extend, budget)
            else:
                if extend > budget and items:
                    self._unadmit(r)
                    break
                n = extend
            if not self._alloc(n):
                self._unadmit(r)
                break
            self.waiting.popleft()
            self._mark_started(r)
            r.private += n
            self._new_cached += r.prefix_len
            items.append((r, n))
            rem_total -= need
            budget -= n
            if n < extend:
                self.chunked = r
                break
        return items

    def _sgl_check_decode_mem(self) -> None:
        per = 1 + self.n_drafts if self.spec else 1
        if self.available() >= len(self.running) * per:
            return
        order = sorted(self.running, key=lambda q: (q.out_len, -q.prompt_len), reverse=True)
        retracted: list[Req] = []
        gained = 0
        while len(order) > 1 and self.available() < max(len(order) * RETRACT_DECODE_STEPS, len(order) * per):
            victim = order.pop()
            gained += victim.private
            self._retract(victim)
            retracted.append(victim)
        if not retracted:
            return
        self.running = [q for q in self.running if q not in retracted]
        old = self.ratio
        total_decoded = sum(q.out_len for q in self.running)
        total_max_new = sum(q.max_new for q in self.running) or 1
        self.ratio = min(1.0, (total_decoded + RETRACT_DECODE_STEPS * len(self.running)) / total_max_new)
        self.log.warning(
            f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
            f"#new_tokens_gained: {gained}, #new_token_ratio: {old:.4f} -> {self.ratio:.4f}",
            rank=True,
        )

    def _retract(self, r: Req) -> None:
        st = self.stats
        st.retracted_reqs += 1
        st.retracted_since_log += 1
        st.retracted_in += r.prompt_len
        st.retracted_out += r.out_len
        r.retractions += 1
        self._release(r, insert=False)
        self.waiting.appendleft(r)

    # ---- vLLM scheduling ----------------------------------------------------------------------------
    def vllm_plan(self) -> tuple[list[tuple[Req, int]], list[Req], int, int]:
        budget = self.cfg.chunk or 8192
        prefill: list[tuple[Req, int]] = []
        decode: list[Req] = []
        dec_tokens = 0
        dec_ctx = 0
        preempted = False
        running = self.running
        # fast path: every running request is decoding and the pool has room
        need = 0
        all_decode = True
        for r in running:
            if r.computed < r.fill_len:
                all_decode = False
                break
            need += 1 + (len(self._draft(r)) if self.spec else 0)
        if all_decode and need <= budget and self.free_tokens() >= need:
            self.private_used += need
            for r in running:
                n = 1 + len(r.draft) if self.spec else 1
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
                    n = 1 + (len(self._draft(r)) if self.spec else 0)
                    is_prefill = False
                ok = True
                while not self._alloc(n):
                    victim = running.pop()
                    self._preempt(victim)
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
            while self.waiting and budget > 0 and len(running) < self.max_running:
                r = self.waiting[0]
                self._admit_prefix(r)
                n = min(r.fill_len - r.computed, budget)
                if not self._alloc(n):
                    self._unadmit(r)
                    break
                self.waiting.popleft()
                self._mark_started(r)
                r.private += n
                running.append(r)
                prefill.append((r, n))
                budget -= n
        return prefill, decode, dec_tokens, dec_ctx

    def _draft(self, r: Req) -> list[int]:
        assert r.drafter is not None
        r.draft = r.drafter.propose(self.n_drafts)
        return r.draft

    def _preempt(self, r: Req) -> None:
        self.stats.preemptions += 1
        self.stats.preemptions_since_log += 1
        r.retractions += 1
        self._release(r, insert=True)
        self.waiting.appendleft(r)

    # ---- applying a finished step ---------------------------------------------------------------
    def apply(
        self,
        prefill: list[tuple[Req, int]],
        decode: list[Req],
        graph: bool,
        dt: float,
        now: float | None = None,
    ) -> None:
        """Apply a step that ends at `now` (default: the clock): tokens, finishes, stats, log lines."""
        stats = self.stats
        if now is None:
            now = self.clock()
        sgl = self.sgl
        finished: list[Req] = []
        new_prefill_tokens = 0
        first_tokens: list[Req] = []
        for r, n in prefill:
            if r.finished:
                continue
            r.computed += n
            new_prefill_tokens += n
            if r.computed >= r.fill_len:
                if self.chunked is r:
                    self.chunked = None
                if r.max_new == 0:  # prefill only (SGLang allows max_new_tokens=0)
                    r.finish_reason = {"type": "length", "length": 0}
                    finished.append(r)
                    continue
                # the prefill's forward pass yields the next token
                tok = self._next(r)
                r.ctx.append(tok)
                if sgl:
                    self.running.append(r)
                if r.first_token is None:
                    r.first_token = now
                    first_tokens.append(r)
                    if not r.health:
                        stats.ttft.observe(now - r.arrival)
                elif not r.health:
                    stats.itl.observe(now - r.last_emit)
                r.last_emit = now
                if self._check_finish(r):
                    finished.append(r)
                else:
                    r.sink.emit(r, False)
        gen = 0
        spec = self.spec
        gaps: dict[float, int] = {}
        interval = self.cfg.stream_interval
        if spec:
            for r in decode:
                if r.finished:
                    continue
                k = self._verify(r)
                r.computed += k
                if sgl:
                    self._alloc(k)
                    r.private += k
                gen += k
                if not r.health:
                    stats.itl.observe((now - r.last_emit) / k, k, now - r.last_emit)
                r.last_emit = now
                if self._check_finish(r):
                    finished.append(r)
                elif interval == 1 or r.out_len // interval != (r.out_len - k) // interval:
                    r.sink.emit(r, False)
        else:
            # hot path: one token per running request
            if sgl:
                n_live = 0
                for r in decode:
                    if not r.finished:
                        n_live += 1
                free = self.free_tokens()
                if free < n_live and self.tree is not None:
                    self.tree.evict(n_live - free)
                self.private_used += n_live
            for r in decode:
                if r.finished:
                    continue
                gen += 1
                m = r.lm
                # inline EmulatedLM.next_token
                ptr = m.ptr
                rnd = m.rng.random
                if ptr >= 0 and rnd() < m.p_stay:
                    m.ptr = ptr + 1
                    tok = r.ctx[ptr]
                else:
                    tok = m.jump()
                ctx = r.ctx
                ctx.append(tok)
                r.computed += 1
                if sgl:
                    r.private += 1
                gap = now - r.last_emit
                gaps[gap] = gaps.get(gap, 0) + 1
                r.last_emit = now
                n_out = len(ctx) - r.prompt_len
                if (
                    n_out >= r.max_new or (not r.ignore_eos and (n_out >= r.natural_len or r.stop_ids))
                ) and self._check_finish(r):
                    finished.append(r)
                    continue
                if interval == 1 or n_out % interval == 0:
                    r.sink.emit(r, False)
            observe = stats.itl.observe
            for gap, cnt in gaps.items():
                observe(gap, cnt)
        stats.events += len(decode) + len(prefill)
        if spec and not sgl:
            # vLLM allocated slots for every draft; give back the rejected ones
            for r in decode:
                extra = r.private - r.computed + r.prefix_len
                if extra > 0:
                    r.private -= extra
                    self.private_used -= extra
        gen += sum(1 for r, _ in prefill if r.computed >= r.fill_len)
        stats.generation_tokens += gen
        stats.prompt_tokens += new_prefill_tokens
        self.gen_tokens_since_log += gen
        self.gen_tokens_since_stats += gen
        self.prompt_tokens_since_stats += new_prefill_tokens
        stats.realtime_tokens["prefill_compute"] += new_prefill_tokens
        stats.realtime_tokens["decode"] += gen
        stats.graph_passes["decode_cuda_graph" if graph else "decode_none"] += 1 if decode else 0
        stats.iter_tokens.observe(new_prefill_tokens + len(decode))
        stats.steps += 1
        self.last_finished = len(finished)
        self.last_first_tokens = first_tokens
        for r in finished:
            self._finish(r, now)
        if finished:
            self.running = [r for r in self.running if not r.finished]
        if sgl:
            if prefill:
                self._sgl_prefill_log(prefill, new_prefill_tokens, dt)
            if decode:
                self.decode_steps_since_log += 1
                if self.decode_steps_since_log >= self.cfg.decode_log_interval:
                    self._sgl_decode_log(graph, now)
        else:
            if now - self.last_stats_wall >= 10.0 * self.scale:
                self._vllm_stats_log(now)

    def _model(self, r: Req) -> lm.EmulatedLM:
        if r.lm is None:
            r.lm = lm.EmulatedLM(r.ctx, self.model.vocab, lm.seed_of(r.ctx, self.salt))
            if not r.ignore_eos:
                r.natural_len = r.lm.natural_length()
        return r.lm

    def _next(self, r: Req) -> int:
        return self._model(r).next_token()

    def _verify(self, r: Req) -> int:
        """Compare the drafts with the model's real continuation; emit accepted + 1 bonus token."""
        self._model(r)
        draft = r.draft if not self.sgl else self._draft(r)
        accepted = 0
        for d in draft:
            tok = r.lm.next_token()
            r.ctx.append(tok)
            if tok != d:
                break
            accepted += 1
            if r.out_len >= r.max_new:
                break
        else:
            r.ctx.append(r.lm.next_token())
        emitted = accepted + 1
        if r.out_len > r.max_new:  # never exceed max_new_tokens
            del r.ctx[r.prompt_len + r.max_new :]
            emitted = min(emitted, r.max_new)
        st = self.stats
        r.verify_ct += 1
        r.accepted += accepted
        r.proposed += self.n_drafts if self.sgl else len(draft)
        while len(r.hist) <= accepted:
            r.hist.append(0)
        r.hist[accepted] += 1
        st.spec_verify += 1
        st.spec_emitted += emitted
        if draft:
            st.spec_drafts += 1
            st.spec_draft_tokens += len(draft)
            st.spec_accepted += accepted
            for pos in range(accepted):
                st.spec_per_pos[pos] += 1
        return emitted

    def _check_finish(self, r: Req) -> bool:
        n = r.out_len
        if not r.ignore_eos:
            if n >= r.natural_len:
                del r.ctx[r.prompt_len + r.natural_len :]
                r.ctx[-1] = self.model.eos_token_id
                r.finish_reason = {"type": "stop", "matched": self.model.eos_token_id}
                return True
            if r.stop_ids and r.ctx[-1] in r.stop_ids:
                r.finish_reason = {"type": "stop", "matched": r.ctx[-1]}
                return True
        if n >= r.max_new:
            r.finish_reason = {"type": "length", "length": r.max_new}
            return True
        return False

    def _finish(self, r: Req, now: float) -> None:
        r.finished = True
        r.e2e = now - r.arrival
        st = self.stats
        self._release(r, insert=True)
        if not r.health:
            st.e2e.observe(r.e2e)
            st.retractions_hist.observe(r.retractions)
            st.finished_by_reason[r.finish_reason["type"] if r.finish_reason else "length"] += 1
            if r.cached_tokens:
                st.cached_tokens += r.cached_tokens
        r.sink.emit(r, True)
        self.completed += 0 if r.health else 1
        self._notify()
        self._on_finish()

    # ---- log lines -------------------------------------------------------------------------------
    def token_usage(self) -> float:
        return self.used_tokens() / self.capacity if self.capacity else 0.0

    def _sgl_prefill_log(self, prefill: list[tuple[Req, int]], new_tok: int, dt: float) -> None:
        hit = self._new_cached
        self._new_cached = 0
        n_new_done = sum(1 for r, _ in prefill if r.computed >= r.fill_len and not r.finished)
        self.stats.cache_hit_rate = hit / (hit + new_tok) if hit + new_tok else 0.0
        pending = (self.chunked.fill_len - self.chunked.computed) if self.chunked else 0
        self.log.sgl(
            f"Prefill batch, #new-seq: {len(prefill)}, #new-token: {new_tok}, #cached-token: {hit}, "
            f"token usage: {self.token_usage():.2f}, #running-req: {max(len(self.running) - n_new_done, 0)}, "
            f"#queue-req: {len(self.waiting)}, #pending-token: {pending}, cuda graph: False, "
            f"input throughput (token/s): {new_tok / max(dt * self.scale, 1e-9):.2f}",
            rank=True,
        )

    def _sgl_decode_log(self, graph: bool, now: float) -> None:
        thr = self.gen_tokens_since_log / max(now - self.last_decode_log, 1e-9)
        self.stats.last_gen_throughput = thr
        spec = ""
        st = self.stats
        if self.spec and st.spec_verify:
            spec = (
                f"accept len: {st.spec_emitted / st.spec_verify:.2f}, "
                f"accept rate: {st.spec_accepted / max(st.spec_verify * self.n_drafts, 1):.2f}, "
            )
        self.log.sgl(
            f"Decode batch, #running-req: {len(self.running)}, #token: {self.used_tokens()}, "
            f"token usage: {self.token_usage():.2f}, {spec}cuda graph: {graph}, "
            f"gen throughput (token/s): {thr:.2f}, #queue-req: {len(self.waiting)}, ",
            rank=True,
        )
        self.decode_steps_since_log = 0
        self.gen_tokens_since_log = 0
        self.last_decode_log = now

    def _vllm_stats_log(self, now: float) -> None:
        dt = max(now - self.last_stats_wall, 1e-9)
        st = self.stats
        q, h = st.prefix_queries, st.prefix_hits
        dq, dh = q - self.last_hit_q[0], h - self.last_hit_q[1]
        hit_rate = 100.0 * dh / dq if dq else 0.0
        self.last_hit_q = (q, h)
        pre = f", Preemptions: {st.preemptions_since_log}" if st.preemptions_since_log else ""
        st.preemptions_since_log = 0
        self.log.vllm(
            f"Engine 000: Avg prompt throughput: {self.prompt_tokens_since_stats / dt:.1f} tokens/s, "
            f"Avg generation throughput: {self.gen_tokens_since_stats / dt:.1f} tokens/s, "
            f"Running: {len(self.running)} reqs, Waiting: {len(self.waiting)} reqs{pre}, "
            f"GPU KV cache usage: {100.0 * self.token_usage():.1f}%, Prefix cache hit rate: {hit_rate:.1f}%",
            src="loggers.py:123",
            proc="APIServer",
        )
        if self.spec and st.spec_drafts:
            acc = st.spec_accepted / max(st.spec_draft_tokens, 1)
            per_pos = ", ".join(f"{st.spec_per_pos[i] / st.spec_drafts:.3f}" for i in range(self.n_drafts))
            self.log.vllm(
                f"SpecDecoding metrics: Mean acceptance length: {1 + st.spec_accepted / st.spec_drafts:.2f}, "
                f"Accepted throughput: {st.spec_accepted / dt:.2f} tokens/s, "
                f"Drafted throughput: {st.spec_draft_tokens / dt:.2f} tokens/s, "
                f"Accepted: {st.spec_accepted} tokens, "
                f"Drafted: {st.spec_draft_tokens} tokens, Per-position acceptance rate: {per_pos}, "
                f"Avg Draft acceptance rate: {100 * acc:.1f}%",
                src="metrics.py:96",
                proc="APIServer",
            )
        self.prompt_tokens_since_stats = 0
        self.gen_tokens_since_stats = 0
        self.last_stats_wall = now
