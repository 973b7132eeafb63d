"""Data-parallel ranks: `--dp-size N` (SGLang) / `--data-parallel-size N` (vLLM) behind one endpoint.

Why: a DP rank is a whole engine replica (its own scheduler, KV pool and step loop on its own TP group
of GPUs), so N ranks serve about N times the decode throughput of one while each request still sees one
replica's latency. Modelling that needs N independent schedulers, not one scheduler with N times the
KV: a request lives on one rank for its whole life, and its batch is that rank's batch.

What the engines do, and what is emulated here:
- SGLang (`python/sglang/srt/managers/data_parallel_controller.py`, `--load-balance-method`, default
  `round_robin`): the controller hands requests to the ranks in turn, whatever their load. Only
  `round_robin` is emulated; `shortest_queue` is refused by name.
- vLLM 0.11 (`vllm/v1/engine/core_client.py`, `DPLBAsyncMPClient.get_core_engine_for_request`): the
  engine with the lowest `waiting * 4 + running` wins, ties to the lowest index from the client's start
  index (0 for one API server). vLLM reads the counts from a coordinator every 100 ms and bumps the
  chosen engine's waiting count locally in between; here the counts are exact at each dispatch.
- A request is dispatched when it reaches the engine core (after the intake latency: HTTP,
  tokenisation), in the live server and in the replay alike.
- GPUs: dp x tp must fit the emulated node (`gpus_per_node` of the hardware profile); one node only.

The live driver (`DPEngine.run`) steps every rank in one event loop: each rank plans, prices and
computes its step (writes held, as engine.py does) and the loop sleeps to the earliest deadline among
the ranks, writing each rank's step at its own deadline. Each rank keeps its own busy-period anchor,
slips and pacing evidence; /metrics sums the evidence (the realtime factor is then the ranks' emulated
seconds over their busy wall seconds, a weighted mean).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .capacity import Capacity
from .catalog import Hardware, ModelSpec
from .cli import Config
from .engine import Engine
from .flavours.base import Flavour
from .httpserver import HELD, HOLD, flush_held, flush_pending
from .intake import Intake
from .logs import CORE, Logger
from .metrics import Histogram
from .pacing import BLOCKING_SLEEP_MAX_S, COARSE_MARGIN_S, GRACE_FRACTION, GRACE_MAX_S, Evidence, loop_mark
from .scheduler import Req, Stats, build_cost


class Loads(Protocol):
    waiting: Any
    running: Any


# ---- flags and the GPU rule ------------------------------------------------------------------------
def size(cfg: Config) -> int:
    """The data-parallel size from either engine's flag (SGLang `dp_size`, vLLM `data_parallel_size`)."""
    raw = cfg.raw
    return int(raw.get("dp_size") or raw.get("data_parallel_size") or 1)


def check(cfg: Config, gpus_per_node: int) -> str | None:
    """Why this DP configuration cannot start (None: it can), naming the values and the rule."""
    dp = size(cfg)
    sgl = cfg.flavour == "sglang"
    dp_flag = "--dp-size" if sgl else "--data-parallel-size"
    tp_flag = "--tp-size" if sgl else "--tensor-parallel-size"
    if dp < 1:
        return f"argument {dp_flag}: {dp} must be >= 1"
    if dp == 1:
        return None
    raw = cfg.raw
    if cfg.nnodes > 1:
        return f"argument {dp_flag}: enginesim emulates DP ranks on one node (got --nnodes {cfg.nnodes})"
    if raw.get("enable_dp_attention"):
        return (
            "argument --enable-dp-attention: DP attention (ranks inside one TP group) is not emulated; "
            f"{dp_flag} {dp} alone runs {dp} independent replicas"
        )
    method = raw.get("load_balance_method") or "round_robin"
    if sgl and method != "round_robin":
        return f"argument --load-balance-method: enginesim emulates round_robin only (got {method})"
    if raw.get("disaggregation_mode") not in (None, "null") or raw.get("kv_transfer_config"):
        return f"argument {dp_flag}: data-parallel ranks with prefill/decode disaggregation are not emulated"
    if cfg.sim.scheduler_process:
        return (
            f"argument {dp_flag}: --sim-scheduler-process runs one scheduler; it does not take {dp_flag} {dp}"
        )
    if dp * cfg.tp > gpus_per_node:
        return (
            f"argument {dp_flag}: {dp_flag} {dp} x {tp_flag} {cfg.tp} = {dp * cfg.tp} GPUs, but the emulated "
            f"node has {gpus_per_node} (rule: data-parallel size x tensor-parallel size <= GPUs per node)"
        )
    return None


def rank_suffix(cfg: Config, rank: int) -> str:
    """SGLang's scheduler log prefix of a DP rank: ` DP1` (` DP1 TP0` when TP > 1)."""
    return f" DP{rank}" + (" TP0" if cfg.tp > 1 else "")


class RankLogger(Logger):
    """A rank's lines: SGLang's ` DPi` prefix, vLLM's `EngineCore_DPi` process name."""

    def __init__(self, flavour: Any, suffix: str, rank: int) -> None:
        super().__init__(flavour, suffix)
        self.core = f"EngineCore_DP{rank}"

    def line(
        self,
        msg: str,
        rank: bool = False,
        level: str = "INFO",
        src: str = "api_server.py:1000",
        proc: str = "APIServer",
    ) -> None:
        super().line(msg, rank, level, src, self.core if proc == CORE else proc)


# ---- dispatch --------------------------------------------------------------------------------------
def picker(flavour: str) -> Callable[[Sequence[Loads]], int]:
    """The engine's choice of rank for the next request."""
    if flavour == "sglang":
        turn = [0]

        def round_robin(ranks: Sequence[Loads]) -> int:
            i = turn[0] % len(ranks)
            turn[0] = i + 1
            return i

        return round_robin

    def least_score(ranks: Sequence[Loads]) -> int:
        best, chosen = None, 0
        for i, k in enumerate(ranks):
            score = len(k.waiting) * 4 + len(k.running)
            if best is None or score < best:
                best, chosen = score, i
        return chosen

    return least_score


# ---- sums over ranks (metrics and /server_info read one object) -----------------------------------
def _merge_hist(hists: list[Histogram]) -> Histogram:
    out = Histogram(hists[0].buckets)
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
        out.n += h.n
        out.sum += h.sum
    return out


def merged(objs: list[Any], blank: Any) -> Any:
    """`blank` filled with the sums of `objs`' fields: numbers add, counters add, histograms merge,
    deques concatenate; a `*_max` field takes the maximum, a rate the mean, `scale`/`slice_s` the first
    rank's."""
    for name, first in vars(objs[0]).items():
        vals = [vars(o)[name] for o in objs]
        if isinstance(first, Histogram):
            value: Any = _merge_hist(vals)
        elif isinstance(first, collections.Counter):
            value = sum(vals, collections.Counter())
        elif isinstance(first, collections.deque):
            value = collections.deque((x for v in vals for x in v), maxlen=first.maxlen)
        elif isinstance(first, bool) or not isinstance(first, (int, float)):
            value = first
        elif name.endswith("_max"):
            value = max(vals)
        elif name == "cache_hit_rate":
            value = sum(vals) / len(vals)
        elif name in ("scale", "slice_s"):
            value = first
        else:
            value = sum(vals)
        setattr(blank, name, value)
    return blank


def merge_expositions(texts: list[str], flavour: str) -> str:
    """One Prometheus text from one text per rank. SGLang: scheduler series (those with `tp_rank`) get
    `dp_rank="i"`, the tokenizer's series (no `tp_rank`) are one process's in the engine, so the ranks'
    values are summed. vLLM: every series carries its engine index, `engine="i"`."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, dict[str, float]] = {}
    for i, text in enumerate(texts):
        family = ""
        for line in text.splitlines():
            if line.startswith("# "):
                family = line.split(" ", 3)[2]
                if family not in heads:
                    order.append(family)
                    heads[family] = []
                    samples[family] = {}
                if i == 0:
                    heads[family].append(line)
                continue
            if not line:
                continue
            series, value = line.rsplit(" ", 1)
            if flavour == "vllm":
                series = series.replace('engine="0"', f'engine="{i}"', 1)
            elif 'tp_rank="' in series:
                series = series.replace("{", f'{{dp_rank="{i}",', 1)
            bucket = samples[family]
            bucket[series] = bucket.get(series, 0.0) + float(value)
    out: list[str] = []
    for family in order:
        out.extend(heads[family])
        out.extend(f"{s} {v}" for s, v in samples[family].items())
    return "\n".join(out) + "\n"


class _RankView:
    """The App as one rank's exposition sees it (`e` is the rank)."""

    def __init__(self, app: Any, rank: Engine) -> None:
        self._app = app
        self.e = rank

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)


class _Trees:
    """The ranks' prefix caches as one (SGLang /flush_cache, vLLM /reset_prefix_cache)."""

    def __init__(self, ranks: list[Engine]) -> None:
        self.trees = [k.tree for k in ranks if k.tree is not None]

    @property
    def total(self) -> int:
        return sum(t.total for t in self.trees)

    @property
    def evictable(self) -> int:
        return sum(t.evictable for t in self.trees)

    def reset(self) -> None:
        for t in self.trees:
            t.reset()

    def evict(self, n: int) -> None:
        del n
        for t in self.trees:
            t.evict(t.evictable)


class _Pace:
    """The live driver's state of one rank."""

    __slots__ = ("blocked", "busy", "gather_until", "held", "mark", "plan_at", "short", "step")

    def __init__(self) -> None:
        self.mark = loop_mark()  # at the rank's last write or idle: for a slip's evidence line
        self.busy = False
        self.blocked = False
        self.plan_at = 0.0
        self.gather_until = 0
        self.short = 0.0
        self.step: tuple[float, float, float, float, int] | None = (
            None  # deadline, length, slip, emulated, events
        )
        self.held: list[Any] = []


# ---- the live engine -------------------------------------------------------------------------------
class DPEngine(Intake):
    """N rank engines behind one App: the App's view of "the engine" (dispatch, sums, the driver)."""

    def __init__(
        self, cfg: Config, fl: Flavour, model: ModelSpec, hw: Hardware, cap: Capacity, log: Logger
    ) -> None:
        n = size(cfg)
        self.cfg = cfg
        self.model = model
        self.cap = cap
        self.log = log
        self.wake = asyncio.Event()
        self.ready = False
        self._dead: str | None = None
        self.ranks: list[Engine] = []
        for i in range(n):
            rlog = log if i == 0 else RankLogger(cfg.flavour, rank_suffix(cfg, i), i)
            if i > 0:  # rank 0's lines came with the head's start-up
                for line in cap.lines or []:
                    fl.capacity_line(rlog, line)
                if cfg.cuda_graph:
                    fl.graph_lines(rlog)
            k = Engine(cfg, model, cap, build_cost(cfg, model, hw, cap), rlog)
            k.wake = self.wake
            self.ranks.append(k)
        self.pace = [_Pace() for _ in range(n)]
        self.pick = picker(cfg.flavour)
        self.where: dict[int, Engine] = {}
        self.intakes: dict[int, tuple[float, asyncio.TimerHandle | None, Req]] = {}
        first = self.ranks[0]
        self.capacity = first.capacity
        self.max_running = first.max_running
        self.spec = first.spec
        self.n_drafts = first.n_drafts

    # ---- what the App reads --------------------------------------------------------------------------
    @property
    def cost(self) -> Any:
        return self.ranks[0].cost  # the profiler traces rank 0, as a GPU-0 trace of the real engine

    @cost.setter
    def cost(self, value: Any) -> None:
        self.ranks[0].cost = value

    @property
    def dead(self) -> str | None:
        return self._dead

    @dead.setter
    def dead(self, value: str | None) -> None:
        self._dead = value
        for k in self.ranks:
            k.dead = value

    @property
    def hung(self) -> bool:
        return any(k.hung for k in self.ranks)

    @property
    def on_crash(self) -> Any:
        return self.ranks[0].on_crash

    @on_crash.setter
    def on_crash(self, cb: Any) -> None:
        for k in self.ranks:
            k.on_crash = cb

    @property
    def scale(self) -> float:
        return self.ranks[0].scale

    @property
    def tree(self) -> _Trees | None:
        return _Trees(self.ranks) if self.cfg.prefix_cache else None

    @property
    def waiting(self) -> list[Req]:
        return [r for k in self.ranks for r in k.waiting]

    @property
    def running(self) -> list[Req]:
        return [r for k in self.ranks for r in k.running]

    @property
    def completed(self) -> int:
        return sum(k.completed for k in self.ranks)

    @property
    def submitted(self) -> int:
        return sum(k.submitted for k in self.ranks)

    @property
    def last_step_wall(self) -> float:
        return max(k.last_step_wall for k in self.ranks)

    @property
    def stats(self) -> Stats:
        return merged([k.stats for k in self.ranks], Stats(self.ranks[0].flavour))

    @property
    def evidence(self) -> Evidence:
        return merged([k.evidence for k in self.ranks], Evidence(self.scale))

    def lag_summary(self) -> dict[str, float]:
        return self.evidence.lag_summary()

    def used_tokens(self) -> int:
        return sum(k.used_tokens() for k in self.ranks)

    def free_tokens(self) -> int:
        return sum(k.free_tokens() for k in self.ranks)

    def token_usage(self) -> float:
        return self.used_tokens() / (self.capacity * len(self.ranks)) if self.capacity else 0.0

    def idle(self) -> bool:
        return all(k.idle() for k in self.ranks)

    def exposition(self, app: Any, render: Callable[[Any], str]) -> str:
        """The engine's metrics with one series per rank where the engine has them."""
        return merge_expositions([render(_RankView(app, k)) for k in self.ranks], self.cfg.flavour)

    # ---- requests --------------------------------------------------------------------------------------
    def submit(self, r: Req) -> None:
        k = self.ranks[self.pick(self.ranks)]
        if len(self.where) > 4096:  # forget the requests that finished
            live = self._live_ids()
            self.where = {i: e for i, e in self.where.items() if i in live}
        self.where[id(r)] = k
        k.submit(r)

    def _live_ids(self) -> set[int]:
        return {id(r) for k in self.ranks for r in (*k.waiting, *k.running)}

    def _intake_done(self, r: Req, due: float) -> None:
        """Dispatch a request whose intake is over to a rank; a late one is charged against the plans
        of the rank it went to (Engine._check_entry)."""
        if r.finished:
            return
        if self.dead:
            r.finished = True
            r.finish_reason = {"type": "abort", "message": f"engine dead: {self.dead}"}
            r.sink.fail(r, f"engine dead: {self.dead}")
            return
        self.submit(r)
        if due < r.arrival:
            r.arrival = r.queued_at = due
            self.where[id(r)]._check_entry(r, due)

    def abort(self, r: Req) -> None:
        (self.where.pop(id(r), None) or self.ranks[0]).abort(r)

    def fail_all(self, message: str) -> None:
        for k in self.ranks:
            k.fail_all(message)

    def flush_cache(self) -> bool:
        if not self.idle():
            return self.ranks[0].flush_cache()  # logs the engine's refusal
        return all([k.flush_cache() for k in self.ranks])

    def set_scale(self, scale: float) -> bool:
        if not self.idle() or not scale > 0:
            return False
        return all([k.set_scale(scale) for k in self.ranks])

    # ---- the driver ------------------------------------------------------------------------------------
    def _start(self, i: int, now: float) -> None:
        """Plan, price and compute rank i's next step (writes held) when its time to plan has come."""
        k, p = self.ranks[i], self.pace[i]
        if self.intakes:
            self._admit_due(now)  # every request due by now reaches its rank before this rank plans
        if k.dead or k.hung or p.blocked:
            return
        if k.idle():
            if p.busy:
                p.mark = loop_mark()
            p.busy = False
            return
        if not p.busy:
            p.busy = True
            first = min(r.arrival for r in k.waiting) if k.waiting else now
            k.wall0 = first - k.sim_t * k.scale
            k.evidence.busy_start(first)
            head = k.waiting[0] if k.waiting else None
            p.plan_at = now
            if head is not None:
                n = min(len(head.ctx), self.cfg.chunk or len(head.ctx))
                alone = k.cost.step([(n, 0)], 0, 0, 0).total * k.scale
                p.plan_at = first + min(GRACE_MAX_S, GRACE_FRACTION * alone)
            p.gather_until = 1 << 62
        full = len(k.waiting) >= k.max_running or sum(len(r.ctx) for r in k.waiting) >= k.first_step_budget()
        if now < p.plan_at and self.submitted < p.gather_until and not full:
            return
        prefill, decode, dec_tokens, dec_ctx = k.plan()
        k._note_plan(now, prefill, dec_tokens)
        if not prefill and not decode:
            p.blocked = True  # KV blocked: wait for a finish or an abort
            return
        c = k.cost.step([(n, r.computed) for r, n in prefill], len(decode), dec_tokens, dec_ctx)
        scale = k.scale
        length = c.total * scale
        start = k.wall0 + k.sim_t * scale
        slipped = 0.0
        if now - start > length:
            slipped = now - start
            k.evidence.slip(slipped)
            k._slip_line(slipped, now, p.mark)
            k.wall0 += slipped
            start = now
        k.sim_t += c.total
        HOLD[0] = True
        try:
            k.apply(prefill, decode, c.graph, c.total, start + length)
        finally:
            HOLD[0] = False
        p.held = HELD[:]
        HELD.clear()
        p.step = (start + length, length, slipped, c.total, len(decode) + len(prefill))

    def _write(self, i: int) -> None:
        """Rank i's step at its deadline: its held writes, then its pacing evidence."""
        k, p = self.ranks[i], self.pace[i]
        assert p.step is not None
        deadline, length, slipped, emulated, events = p.step
        p.step = None
        wrote = time.perf_counter()
        HELD.extend(p.held)
        p.held = []
        flush_held()
        flush_pending()
        done = time.perf_counter()
        if k.dead:
            return
        k.last_step_wall = done
        p.mark = loop_mark()
        late = wrote - deadline + slipped
        k.evidence.step(emulated, length, late, done - wrote, done, events)
        if k.last_first_tokens:
            k.evidence.first_token_step(length, late, wrote - deadline, done, k.last_first_tokens)
        grace = GRACE_FRACTION * min(length, p.short or length)
        p.short = length
        p.plan_at = done
        if k.last_finished:  # bounded as engine.py bounds it (Engine.decode_floor)
            p.plan_at += min(GRACE_MAX_S, grace, GRACE_FRACTION * (k.decode_floor() or length))
        p.gather_until = self.submitted + k.last_finished

    async def run(self) -> None:
        perf = time.perf_counter
        n = len(self.ranks)
        while True:
            now = perf()
            for i in range(n):
                if self.pace[i].step is None:
                    self._start(i, now)
            deadlines = [p.step[0] for p in self.pace if p.step is not None]
            plans = [
                p.plan_at
                for k, p in zip(self.ranks, self.pace, strict=True)
                if p.step is None and p.busy and not p.blocked and not k.idle() and not k.dead and not k.hung
            ]
            if not deadlines and not plans:
                flush_pending()
                idle_from = loop_mark()
                for p in self.pace:
                    p.mark = idle_from
                self.wake.clear()
                await self.wake.wait()
                for p in self.pace:
                    p.blocked = False
                continue
            target = min(deadlines + plans)
            rest = target - perf()
            if deadlines and target == min(deadlines):
                if rest > BLOCKING_SLEEP_MAX_S:
                    await asyncio.sleep(rest - COARSE_MARGIN_S)
                    rest = target - perf()
                if rest > 0:
                    time.sleep(rest)  # precise, as engine.py: the loop's timers wake late on a busy box
            else:
                await asyncio.sleep(max(rest, 0.0))
            now = perf()
            for i in sorted(range(n), key=lambda j: self.pace[j].step[0] if self.pace[j].step else 0.0):
                step = self.pace[i].step
                if step is not None and step[0] <= now:
                    self._write(i)
            if any(p.blocked for p in self.pace) and self.wake.is_set():
                self.wake.clear()
                for p in self.pace:
                    p.blocked = False
            # read what arrived meanwhile (requests, closes) before the next plans: back-to-back short
            # steps sleep blocking and would otherwise never let the loop read its sockets
            await asyncio.sleep(0)
