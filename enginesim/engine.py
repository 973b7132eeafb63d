"""The live engine: the shared scheduler (scheduler.py) driven against the wall clock.

Why: a client must see each step's events at the wall time the emulated hardware would produce them,
`wall0 + virtual_end × time_scale`, one write per connection per step, or its latencies measure this
box instead of the emulated GPU. The loop plans a step, prices it, computes its outcome (held, not
written), waits for its absolute deadline and writes it: only the syscalls are left at the deadline.
The wait is a blocking time.sleep (precise to ~0.2 ms at p95 on this busy box, where the event loop's
timers wake 1-5 ms late at p95); only a step longer than `pacing.BLOCKING_SLEEP_MAX_S` sleeps on the
loop first. Requests that arrive meanwhile are read at the step's end, which is when the scheduler
would look at them anyway (a request joins the step after the one during which it arrived).
Catch-up is bounded at one step: a loop that is more than one step behind moves its schedule (a slip)
instead of bursting several steps into one write, and every slip and every late write is counted in
`pacing.Evidence`, which /metrics exposes so each case can be judged (ok / degraded / saturated).

Arrivals: a closed-loop client sends its next request when it reads the last event of the previous
one, a little after the step that finished it. The replay counts that request as arrived at the
step's end; here the loop waits for it (bounded by half of the step just written, and by
`pacing.GRACE_MAX_S`) before planning the next step, so both make the same batch. The next step's
deadline does not move: the wait comes out of the step's own wall time.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from .capacity import Capacity
from .catalog import ModelSpec
from .cli import Config
from .costmodel import CostModel
from .httpserver import HOLD, flush_held, flush_pending
from .intake import Intake
from .logs import Logger
from .pacing import (
    ARRIVAL_QUIET_S,
    BLOCKING_SLEEP_MAX_S,
    COARSE_MARGIN_S,
    GRACE_FRACTION,
    GRACE_MAX_S,
    Evidence,
    gc_clock,
    loop_mark,
    request_short_slice,
)
from .scheduler import Req, Scheduler, Sink, Stats

__all__ = ["Engine", "Req", "Sink", "Stats"]


class Engine(Intake, Scheduler):
    """The scheduler of one head rank, paced against the wall clock, plus its liveness state."""

    def __init__(self, cfg: Config, model: ModelSpec, cap: Capacity, cost: CostModel, log: Logger) -> None:
        super().__init__(cfg, model, cap, cost, log, time.perf_counter, cfg.sim.time_scale)
        self.wake = asyncio.Event()
        self.ready = False
        self.dead: str | None = None
        self.hung = False
        self.on_crash: Any = None
        self.sim_t = 0.0
        self.wall0 = time.perf_counter()
        self.last_step_wall = self.wall0
        self.evidence = Evidence(self.scale)
        self.evidence.slice_s = request_short_slice()
        self._gather: asyncio.Future[None] | None = None
        self._gather_until = 0
        # Recent plans as [wall time, prompt tokens it had room for]: a request due before a plan
        # with room, but read after it, joined a later step than the replay's (entry lateness).
        self.plans: collections.deque[list[float]] = collections.deque(maxlen=256)
        self.late_entries: list[tuple[Req, float]] = []
        # id(req): (due, its timer, req) for the requests still in the intake
        self.intakes: dict[int, tuple[float, asyncio.TimerHandle | None, Req]] = {}

    def _intake_done(self, r: Req, due: float) -> None:
        if r.finished:  # the client went away meanwhile (abort marks it finished)
            return
        if self.dead:  # the engine died meanwhile: fail it as fail_all did the others
            r.finished = True
            r.finish_reason = {"type": "abort", "message": f"engine dead: {self.dead}"}
            r.sink.fail(r, f"engine dead: {self.dead}")
            return
        self.submit(r)
        if due < r.arrival:  # the timer ran late: the request arrived when it was due
            r.arrival = r.queued_at = due
            self._check_entry(r, due)

    def _check_entry(self, r: Req, due: float) -> None:
        """A request submitted after its due time: the first plan since then that had room for its
        prompt is the one the replay gives it. Waiting in the socket (a starved CPU) or on a late timer,
        it missed that plan; the time to the plan it joins is TTFT lateness, counted at that plan. The
        room is taken, so a burst read late is charged only for the requests that would have fit."""
        need = min(len(r.ctx), self.first_step_budget())
        missed = None
        for plan in reversed(self.plans):
            if plan[0] < due:
                break
            if plan[1] >= need:
                missed = plan
        if missed is not None:
            missed[1] -= need
            self.late_entries.append((r, missed[0]))

    def _note_plan(self, wall: float, prefill: list[tuple[Req, int]], dec_tokens: int) -> None:
        """Record a plan's room and charge the requests that missed an earlier one."""
        for r, missed_at in self.late_entries:
            r.entry_late += wall - missed_at
        self.late_entries.clear()
        room = 0.0
        if not self.waiting and len(self.running) < self.max_running:
            room = self.first_step_budget() - sum(n for _, n in prefill)
            if self.flavour.decode_in_token_budget:
                room -= dec_tokens
        self.plans.append([wall, room])

    # ---- hooks of the scheduler -------------------------------------------------------------------
    def _on_submit(self, r: Req) -> None:
        r.mark = self.evidence.slip_s  # the slips from here to its first token are TTFT lateness

    def _notify(self) -> None:
        self.wake.set()
        fut = self._gather
        if fut is not None and self.submitted >= self._gather_until and not fut.done():
            fut.set_result(None)

    def _on_finish(self) -> None:
        crash = self.cfg.sim.crash_after
        if crash is not None and self.completed >= crash and self.on_crash:
            cb, self.on_crash = self.on_crash, None
            cb(f"injected crash after {self.completed} requests (--sim-crash-after/ENGINESIM_CRASH_AFTER)")
        hang = self.cfg.sim.hang_after
        if hang is not None and self.completed >= hang and not self.hung:
            self.hung = True
            self.log.warning(f"enginesim: scheduler hangs now (injected after {self.completed} requests)")

    # ---- time scale ---------------------------------------------------------------------------------
    def set_scale(self, scale: float) -> bool:
        """A new time scale, only between cases (idle): one case runs at one scale."""
        if not self.idle() or not scale > 0:
            return False
        if scale != self.scale:
            self.scale = scale
            self.evidence.set_scale(scale)
        return True

    # ---- the loop -------------------------------------------------------------------------------------
    def first_step_budget(self) -> int:
        """Prompt tokens one prefill step takes (SGLang: the chunk or --max-prefill-tokens; vLLM: the
        token budget): a burst that fills it needs no more waiting."""
        return self.cfg.chunk or self.cfg.max_prefill_tokens

    async def _wait_burst(self, timeout: float) -> None:
        """Let a burst of requests sent together land: wait while they keep arriving (a quiet period of
        ARRIVAL_QUIET_S ends it) until they fill a first step, at most `timeout` wall seconds. The rest
        are read while that step runs: they join later steps anyway."""
        end = time.perf_counter() + timeout
        budget = self.first_step_budget()
        while True:
            rest = end - time.perf_counter()
            waiting = self.waiting
            if rest <= 0 or len(waiting) >= self.max_running or sum(len(r.ctx) for r in waiting) >= budget:
                return
            seen = self.submitted
            await self._wait_arrivals(1, min(rest, ARRIVAL_QUIET_S))
            if self.submitted == seen:
                return

    async def _wait_arrivals(self, n: int, timeout: float) -> None:
        """Wait until `n` more requests were submitted, or `timeout` wall seconds."""
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._gather = fut
        self._gather_until = self.submitted + n
        handle = loop.call_later(timeout, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            handle.cancel()
            self._gather = None

    def decode_floor(self) -> float:
        """Wall seconds of a decode-only step of the requests still running (0: none). The next step
        is at least that long, so the wait for arrivals after a step, bounded by a part of it, cannot
        push it late: bounded by the last two steps only, the wait after the last chunk of a long
        prefill was 30 ms and the decode step after it 9 ms (the mixed A/B slipped 30 ms once per case
        in every run, with the loop idle)."""
        live = [r for r in self.running if not r.finished]
        if not live:
            return 0.0
        ctx = sum(r.computed for r in live)
        return self.cost.step([], len(live), len(live), ctx).total * self.scale

    def _slip_line(self, slipped: float, now: float, mark: tuple[float, float, float]) -> None:
        """Say what the process did while its schedule slipped: CPU close to the wall = this loop was
        busy (reading a burst, collecting garbage); far under it = the box did not run it."""
        wall, cpu, gc_s = mark
        self.log.warning(
            f"enginesim: schedule slipped {slipped * 1e3:.1f} ms before step {self.evidence.steps + 1}; "
            f"in the {(now - wall) * 1e3:.1f} ms since the loop's last step or idle wait this process "
            f"ran {(time.process_time() - cpu) * 1e3:.1f} ms of CPU, "
            f"{(gc_clock().seconds - gc_s) * 1e3:.1f} ms of it collecting garbage"
        )

    async def run(self) -> None:
        perf = time.perf_counter
        ev = self.evidence
        busy = False
        short = 0.0  # wall length of the shorter of the last two steps: bounds the arrival wait
        mark = loop_mark()  # for a slip's evidence line
        while True:
            if self.dead or self.hung or self.idle():
                flush_pending()
                busy = False
                self.wake.clear()
                mark = loop_mark()
                await self.wake.wait()
                continue
            if not busy:
                # A busy period starts where its first request arrived; a burst sent together gets
                # a short window to land before the first plan (the deadline does not move).
                busy = True
                first = min(r.arrival for r in self.waiting) if self.waiting else perf()
                first = max(first, self.last_step_wall)  # not before the previous busy period's last write
                self.wall0 = first - self.sim_t * self.scale
                ev.busy_start(first)
                head = self.waiting[0] if self.waiting else None
                if head is not None:
                    n = min(len(head.ctx), self.cfg.chunk or len(head.ctx))
                    alone = self.cost.step([(n, 0)], 0, 0, 0).total * self.scale
                    await self._wait_burst(min(GRACE_MAX_S, GRACE_FRACTION * alone) - (perf() - first))
            planned = perf()
            if self.intakes:
                self._admit_due(planned)
            prefill, decode, dec_tokens, dec_ctx = self.plan()
            self._note_plan(planned, prefill, dec_tokens)
            if not prefill and not decode:
                # nothing schedulable (KV blocked); wait for a finish/abort or new capacity
                flush_pending()
                busy = False
                self.wake.clear()
                await self.wake.wait()
                continue
            c = self.cost.step([(n, r.computed) for r, n in prefill], len(decode), dec_tokens, dec_ctx)
            scale = self.scale
            length = c.total * scale
            start = self.wall0 + self.sim_t * scale
            now = perf()
            slipped = 0.0
            if now - start > length:  # more than one step behind: move the schedule, never burst
                slipped = now - start
                ev.slip(slipped)
                self._slip_line(slipped, now, mark)
                self.wall0 += slipped
                start = now
            self.sim_t += c.total
            deadline = start + length
            # The step's outcome is computed now and held; only its writes wait for the deadline.
            HOLD[0] = True
            try:
                self.apply(prefill, decode, c.graph, c.total, deadline)
            finally:
                HOLD[0] = False
            rest = deadline - perf()
            if rest > BLOCKING_SLEEP_MAX_S:
                await asyncio.sleep(rest - COARSE_MARGIN_S)
                rest = deadline - perf()
            if rest > 0:
                time.sleep(rest)  # precise: the loop's timers wake 1-5 ms late at p95 on a busy box
            wrote = perf()
            flush_held()
            flush_pending()
            done = perf()
            if self.dead:
                continue
            self.last_step_wall = done
            mark = loop_mark()
            # a slipped step was late by the slip too: the evidence counts lateness against the schedule
            late = wrote - deadline + slipped
            ev.step(c.total, length, late, done - wrote, done, len(decode) + len(prefill))
            if self.last_first_tokens:
                ev.first_token_step(length, late, wrote - deadline, done, self.last_first_tokens)
            grace = GRACE_FRACTION * min(length, short or length)
            short = length
            # the requests the finished ones make room for come back within the grace window
            window = 0.0
            if self.last_finished:
                window = min(GRACE_MAX_S, grace, GRACE_FRACTION * (self.decode_floor() or length))
            await self._wait_arrivals(self.last_finished, window)

    def lag_summary(self) -> dict[str, float]:
        return self.evidence.lag_summary()
