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

from . import catalog, flavours, lm
from .capacity import Capacity
from .catalog import Hardware, ModelSpec
from .cli import Config
from .costmodel import CostModel
from .flavours.base import Flavour
from .logs import Logger
from .metrics import VLLM_ITER_BUCKETS, Histogram
from .radix import RadixCache


def build_cost(cfg: Config, model: ModelSpec, hw: Hardware, cap: Capacity) -> CostModel:
    """The cost model of one engine configuration (the live server and the replay build it here)."""
    flavour = flavours.get(cfg.flavour)
    return CostModel(
        model,
        hw,
        cfg.tp,
        cfg.ep,
        cfg.nnodes,
        cap.kv_bytes_per_token,
        cfg.cuda_graph,
        cfg.cuda_graph_max_bs,
        graph_covers_mixed=flavour.graph_covers_mixed,
        engine=catalog.load_engine_costs(cfg.flavour),
        prefill_graph_max_tokens=flavour.prefill_graph_max_tokens(cfg),
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
        "entry_late",
        "fill_len",
        "finish_reason",
        "finished",
        "first_token",
        "health",
        "hist",
        "host_arrival",
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
        "text_prompt",
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
        text_prompt: bool = False,
    ) -> None:
        self.rid = rid
        self.text_prompt = text_prompt  # arrived as text: the engine tokenised it (intake pays for that)
        self.ctx = list(prompt)
        self.prompt_len = len(prompt)
        self.max_new = max_new
        self.ignore_eos = ignore_eos
        self.stop_ids = stop_ids
        self.sink = sink
        self.arrival = 0.0  # set by Scheduler.submit from the driver's clock
        self.host_arrival = 0.0  # the live server's: when its last byte reached the host (0: unknown)
        self.entry_late = 0.0  # the live engine's: steps it joined late (read after a plan it was due for)
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

    def __init__(self, flavour: Flavour) -> None:
        buckets = flavour.histogram_buckets()
        self.prompt_tokens = 0  # whole prompts, cached part included, as the engine counts them
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
        self.ttft = Histogram(buckets["ttft"])
        self.itl = Histogram(buckets["itl"])
        self.e2e = Histogram(buckets["e2e"])
        self.queue = Histogram(buckets["queue"])
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
        self.flavour = flavours.get(cfg.flavour)
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
        self.stats = Stats(self.flavour)
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
        """The next batch: (prefill chunks, decode requests, decode tokens, decode context sum), by the
        engine's own policy (flavours/*.py `plan`)."""
        return self.flavour.plan(self)

    # ---- admission helpers the policies share --------------------------------------------------------
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

    def _draft(self, r: Req) -> list[int]:
        assert r.drafter is not None
        r.draft = r.drafter.propose(self.n_drafts)
        return r.draft

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
        fl = self.flavour
        kv_at_apply = fl.decode_kv_at_apply  # SGLang: decode KV is taken when the step is applied
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
                if fl.prefill_joins_running:
                    self.running.append(r)
                if r.first_token is None:
                    r.first_token = now
                    first_tokens.append(r)
                    if not r.health:
                        stats.ttft.observe(now - r.arrival)
                        if fl.prompt_tokens_at_first_token:
                            stats.prompt_tokens += r.prompt_len
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
                if kv_at_apply:
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
            if kv_at_apply:
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
                if kv_at_apply:
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
        if spec and not kv_at_apply:
            # KV was taken at planning for every draft (vLLM); give back the rejected ones
            for r in decode:
                extra = r.private - r.computed + r.prefix_len
                if extra > 0:
                    r.private -= extra
                    self.private_used -= extra
        gen += sum(1 for r, _ in prefill if r.computed >= r.fill_len)
        stats.generation_tokens += gen
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
        fl.after_step(self, prefill, decode, new_prefill_tokens, graph, dt, now)

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
        draft = self._draft(r) if self.flavour.drafts_at_verify else r.draft
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
        r.proposed += self.flavour.proposed_drafts(self, draft)
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
            if not self.flavour.prompt_tokens_at_first_token:
                st.prompt_tokens += r.prompt_len
        r.sink.emit(r, True)
        self.completed += 0 if r.health else 1
        self._notify()
        self._on_finish()

    # ---- log lines -------------------------------------------------------------------------------
    def token_usage(self) -> float:
        return self.used_tokens() / self.capacity if self.capacity else 0.0
