"""The replay of data-parallel ranks: N schedulers in one virtual time line (replay.py, dp.py).

Why: the live server's DP ranks step independently, each on its own GPUs; the replay that paces and
checks it must do the same, or its schedule is not the one the live emulator keeps. Events are taken
in time order: a client event (a request due, or one reaching the engine core) before a step end at
the same or a later time; a rank that is free and has work plans its next step at once. As in the
one-rank replay, requests due during a step are delivered before it is applied (they join the next
plan) and a finished request's slot refills at the end of the step that finished it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .costmodel import CostModel
from .scheduler import Req, Scheduler


class _Router:
    """What the client submits to: the engine's dispatch over the ranks."""

    def __init__(self, ranks: Sequence[Scheduler], pick: Callable[[Sequence[Any]], int]) -> None:
        self.ranks = ranks
        self.pick = pick

    def submit(self, r: Req) -> None:
        self.ranks[self.pick(self.ranks)].submit(r)


def drive(
    ranks: Sequence[Scheduler],
    client: Any,
    cost: CostModel,
    pick: Callable[[Sequence[Any]], int],
    w: Any,
) -> list[tuple[float, int]]:
    """Run the client's workload over the ranks; (emulated seconds, events) of every step, any rank."""
    router = _Router(ranks, pick)
    n = len(ranks)
    inflight: list[tuple[float, Any, Any, Any] | None] = [None] * n
    steps: list[tuple[float, int]] = []
    now = 0.0
    client.now = now
    client.send_ready(router, now)
    while True:
        for i, s in enumerate(ranks):
            if inflight[i] is None and not s.idle():
                prefill, decode, dec_tokens, dec_ctx = s.plan()
                if prefill or decode:
                    c = cost.step([(k, r.computed) for r, k in prefill], len(decode), dec_tokens, dec_ctx)
                    inflight[i] = (now + c.total, prefill, decode, c)
        ends = [(x[0], i) for i, x in enumerate(inflight) if x is not None]
        due = client.next_due()
        if not ends:
            stuck = any(not s.idle() for s in ranks)
            if due is None or (stuck and client.in_flight >= (w.concurrency or w.num_prompts)):
                if stuck:
                    raise RuntimeError("replay: the scheduler cannot make progress (KV pool too small?)")
                break
        if due is not None and (not ends or due < min(ends)[0]):
            now = max(now, due)
            client.now = now
            client.send_ready(router, now)
            continue
        end, i = min(ends)
        step = inflight[i]
        assert step is not None
        inflight[i] = None
        _, prefill, decode, c = step
        client.send_ready(router, end)  # open-loop requests due during the step join the next plans
        client.now = end
        ranks[i].apply(prefill, decode, c.graph, c.total)
        steps.append((c.total, len(decode) + len(prefill)))
        now = end
        client.send_ready(router, now)  # closed loop: finished requests' slots refill at the step's end
    return steps
