"""`python -m enginesim replay {sglang|vllm} <server flags> --isl N --osl N --concurrency N ...`

Why: the live emulator is only worth its figures if they are what its own scheduler and cost model
say the emulated hardware does. The replay runs that very scheduler (scheduler.Scheduler) with a
simulated benchmark client in pure virtual time: no sockets, no wall clock, the same answer on any box
in seconds. It is the reference the live emulator is checked against, and a tool in its own right
("what would this config do?").

The client is loadgen's, idealised: requests are due at t=0 (request rate inf) or at seeded Poisson
times, at most `--concurrency` in flight; a request is sent when it is due and a slot is free, and
reaches the server at once; the one that takes a finished request's slot arrives at the end of the
step that finished it, before the next step is planned. Random prompts share no prefix;
`--shared-prefix G:L` makes request i start with group (i mod G)'s L-token prefix. Figures follow
loadgen's definitions and key names (TTFT = first content event - send; TPOT per request =
(E2E - TTFT)/(output tokens - 1); ITL = gaps between content events; percentiles linear; std
population); the output is one JSON line. Extra facts for pacing the live emulator are under
`enginesim_replay`.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import capacity, catalog, cli, dp, dp_replay
from .logs import NullLogger
from .scheduler import Req, Scheduler, build_cost


@dataclass
class Workload:
    isl: int
    osl: int
    concurrency: int | None
    num_prompts: int
    request_rate: float | None = None  # None = inf (all due at once)
    seed: int = 1
    shared_groups: int = 0
    shared_len: int = 0
    # extra requests outside the client's concurrency and figures (the A/B's injection, sent by its own
    # client): (isl, osl, emulated send time)
    inject: tuple[tuple[int, int, float], ...] = ()
    # how the client sends prompts: "ids" (loadgen's default) skips the engine's tokenisation, "text"
    # (the public benchmark clients) pays it in the intake latency
    prompt_format: str = "ids"


class _Record:
    """What the client sees of one request: send time, each content event's time and token count."""

    __slots__ = ("done", "due", "end", "extra", "index", "out", "send", "times", "tokens")

    def __init__(self, index: int, due: float, extra: bool = False) -> None:
        self.index = index
        self.due = due
        self.extra = extra
        self.send = 0.0
        self.end = 0.0
        self.out = 0
        self.done = False
        self.times: list[float] = []
        self.tokens: list[int] = []


class _Sink:
    __slots__ = ("client", "rec", "sent")

    def __init__(self, client: _Client, rec: _Record) -> None:
        self.client = client
        self.rec = rec
        self.sent = 0

    def emit(self, r: Req, finished: bool) -> None:
        n = r.out_len
        if n > self.sent:
            self.client.out_sum += n
            self.rec.times.append(self.client.now)
            self.rec.tokens.append(n - self.sent)
            self.sent = n
        if finished:
            self.rec.out = n
            self.rec.end = self.client.now
            self.rec.done = True
            if not self.rec.extra:
                self.client.in_flight -= 1

    def fail(self, r: Req, message: str) -> None:  # pragma: no cover - no faults in a replay
        raise RuntimeError(f"replay request {self.rec.index} failed: {message}")


class _Client:
    def __init__(self, w: Workload, vocab: int, intake: Callable[[int, bool], float]) -> None:
        self.w = w
        self.intake = intake  # send -> the scheduler sees the request (the engine's intake latency)
        self.arrivals: list[tuple[float, int, Req]] = []  # (arrival, order, request): sent, not arrived
        self.sent = 0
        self.now = 0.0
        self.in_flight = 0
        self.out_sum = 0  # sum over events of the output length so far (a cumulative event's size)
        self.injected: list[tuple[_Record, int]] = []
        self.vocab = vocab
        rng = random.Random(w.seed)
        self.rng = rng
        due = 0.0
        self.records: list[_Record] = []
        for i in range(w.num_prompts):
            if w.request_rate is not None and i > 0:
                due += rng.expovariate(w.request_rate)
            self.records.append(_Record(i, due))
        self.prefixes = [self._ids(w.shared_len) for _ in range(w.shared_groups)]
        self.next = 0
        self.extras = sorted(
            ((_Record(-1 - i, at, extra=True), isl, osl) for i, (isl, osl, at) in enumerate(w.inject)),
            key=lambda x: x[0].due,
        )

    def _ids(self, n: int) -> list[int]:
        """n random word ids (random.random, not randrange: a third of the replay's CPU went here)."""
        rand = self.rng.random
        span = max(self.vocab, 257) - 256
        return [256 + int(rand() * span) for _ in range(n)]

    def prompt(self, i: int) -> list[int]:
        w = self.w
        if w.shared_groups:
            return self.prefixes[i % w.shared_groups] + self._ids(w.isl - w.shared_len)
        return self._ids(w.isl)

    def next_due(self) -> float | None:
        free = self.in_flight < (self.w.concurrency or len(self.records))
        due = [self.records[self.next].due] if self.next < len(self.records) and free else []
        due += [rec.due for rec, _, _ in self.extras]
        if self.arrivals:
            due.append(self.arrivals[0][0])
        return min(due) if due else None

    def _send(self, sched: Scheduler, r: Req, send: float) -> None:
        """The request reaches the scheduler `intake` after its send (at once when that is zero)."""
        at = send + self.intake(len(r.ctx), r.text_prompt)
        self.sent += 1
        heapq.heappush(self.arrivals, (at, self.sent, r))
        self.deliver(sched, self.now)

    def deliver(self, sched: Scheduler, until: float) -> None:
        saved = self.now
        while self.arrivals and self.arrivals[0][0] <= until:
            at, _, r = heapq.heappop(self.arrivals)
            self.now = at
            sched.submit(r)
        self.now = saved

    def send_extras(self, sched: Scheduler, until: float) -> None:
        while self.extras and self.extras[0][0].due <= until:
            rec, isl, osl = self.extras.pop(0)
            rec.send = rec.due
            saved = self.now
            self.now = rec.send
            self._send(
                sched,
                Req(
                    f"replay-extra-{-rec.index}",
                    self._ids(isl),
                    osl,
                    True,
                    _Sink(self, rec),
                    text_prompt=self.w.prompt_format == "text",
                ),
                rec.send,
            )
            self.now = saved
            self.injected.append((rec, isl))

    def send_ready(self, sched: Scheduler, until: float) -> None:
        """Send every request that is due by `until` while a slot is free; each arrives at its send time."""
        self.deliver(sched, until)
        self.send_extras(sched, until)
        limit = self.w.concurrency or len(self.records)
        while self.next < len(self.records) and self.in_flight < limit:
            rec = self.records[self.next]
            if rec.due > until:
                return
            rec.send = max(rec.due, self.now)
            saved = self.now
            self.now = rec.send
            r = Req(
                f"replay-{rec.index}",
                self.prompt(rec.index),
                self.w.osl,
                True,
                _Sink(self, rec),
                text_prompt=self.w.prompt_format == "text",
            )
            self._send(sched, r, rec.send)
            self.now = saved
            self.in_flight += 1
            self.next += 1


def run(cfg: cli.Config, w: Workload) -> dict[str, Any]:
    """Replay one workload against one engine configuration; the loadgen-style result."""
    model = catalog.load_model(cfg.model_path)
    hw = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)
    cap = capacity.compute(cfg, model, hw)
    cost = build_cost(cfg, model, hw, cap)
    if w.isl + w.osl > cap.context_len:
        raise ValueError(f"--isl {w.isl} + --osl {w.osl} exceeds the context length {cap.context_len}")
    client = _Client(w, model.vocab, cost.intake)
    if dp.size(cfg) > 1:
        ranks = [
            Scheduler(cfg, model, cap, cost, NullLogger(cfg.flavour), lambda: client.now)
            for _ in range(dp.size(cfg))
        ]
        return _result(client, w, dp_replay.drive(ranks, client, cost, dp.picker(cfg.flavour), w))
    sched = Scheduler(cfg, model, cap, cost, NullLogger(cfg.flavour), lambda: client.now)
    steps: list[tuple[float, int]] = []  # (emulated seconds, events) per step
    t = 0.0
    client.send_ready(sched, t)
    while True:
        if sched.idle():
            due = client.next_due()
            if due is None:
                break
            t = max(t, due)
            client.now = t
            client.send_ready(sched, t)
            continue
        prefill, decode, dec_tokens, dec_ctx = sched.plan()
        if not prefill and not decode:
            due = client.next_due()
            if due is None or client.in_flight >= (w.concurrency or w.num_prompts):
                raise RuntimeError("replay: the scheduler cannot make progress (KV pool too small?)")
            t = max(t, due)
            client.now = t
            client.send_ready(sched, t)
            continue
        c = cost.step([(n, r.computed) for r, n in prefill], len(decode), dec_tokens, dec_ctx)
        end = t + c.total
        client.send_ready(sched, end)  # open-loop requests due during the step join the next plan
        client.now = end
        sched.apply(prefill, decode, c.graph, c.total)
        steps.append((c.total, len(decode) + len(prefill)))
        t = end
        client.send_ready(sched, t)  # closed loop: finished requests' slots refill at the step's end
    return _result(client, w, steps)


def _result(client: _Client, w: Workload, steps: list[tuple[float, int]]) -> dict[str, Any]:
    res = summarise(w, client.records, steps)
    if client.injected:
        res["injected"] = [
            {
                "isl": len_in,
                "send_s": rec.send,
                "ttft_ms": (rec.times[0] - rec.send) * 1e3 if rec.times else None,
                "e2e_ms": (rec.times[-1] - rec.send) * 1e3 if rec.times else None,
                "output_tokens": rec.out,
            }
            for rec, len_in in client.injected
        ]
    events = res["enginesim_replay"]["events"]
    res["enginesim_replay"]["mean_out_len"] = client.out_sum / events if events else 0.0
    res["enginesim_replay"]["prompt_format"] = w.prompt_format  # ids: no tokenisation in the intake
    return res


def _pct(s: list[float], q: float) -> float | None:
    """numpy.percentile(..., q), linear interpolation, on a sorted list."""
    n = len(s)
    if n == 0:
        return None
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(vals: list[float]) -> dict[str, float | None]:
    if not vals:
        return {k: None for k in ("mean", "median", "std", "p90", "p95", "p99", "max")}
    s = sorted(vals)
    mean = math.fsum(s) / len(s)
    var = math.fsum((x - mean) ** 2 for x in s) / len(s)
    return {
        "mean": mean,
        "median": _pct(s, 50),
        "std": math.sqrt(var),
        "p90": _pct(s, 90),
        "p95": _pct(s, 95),
        "p99": _pct(s, 99),
        "max": s[-1],
    }


def _max_concurrent(recs: list[_Record]) -> int:
    pts = sorted([(r.send, 1) for r in recs] + [(r.end, -1) for r in recs], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in pts:
        cur += d
        best = max(best, cur)
    return best


def summarise(w: Workload, recs: list[_Record], steps: list[tuple[float, int]]) -> dict[str, Any]:
    """loadgen's summary keys (milliseconds, tokens/s) from the replayed client records."""
    done = [r for r in recs if r.done and r.times]
    duration = max(max((r.end for r in recs), default=0.0), 1e-9)  # the main phase starts at t=0
    ttft = [(r.times[0] - r.send) * 1e3 for r in done]
    e2e = [(r.times[-1] - r.send) * 1e3 for r in done]
    tpot = [(e - f) / (r.out - 1) for r, f, e in zip(done, ttft, e2e, strict=True) if r.out > 1]
    itl: list[float] = []
    itl_tok: list[float] = []
    split = any(n != 1 for r in done for n in r.tokens[1:])  # else per token = per event (loadgen too)
    for r in done:
        gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(r.times)]
        itl.extend(gaps)
        if split:
            for gap, n in zip(gaps, r.tokens[1:], strict=True):
                itl_tok.extend([gap / n] * n)
    queue = [max(r.send - r.due, 0.0) * 1e3 for r in recs]
    tin = w.isl * len(done)
    tout = sum(r.out for r in done)
    res: dict[str, Any] = {
        "tool": {"name": "enginesim replay"},
        "random_input_len": w.isl,
        "random_output_len": w.osl,
        "num_prompts": w.num_prompts,
        "max_concurrency": w.concurrency,
        "request_rate": w.request_rate,
        "seed": w.seed,
        "duration": duration,
        "completed": len(done),
        "failed": len(recs) - len(done),
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": len(done) / duration,
        "input_throughput": tin / duration,
        "output_throughput": tout / duration,
        "total_throughput": (tin + tout) / duration,
    }
    itl_s = _stats(itl)
    figures = (("ttft", _stats(ttft)), ("tpot", _stats(tpot)), ("itl", itl_s), ("e2e_latency", _stats(e2e)))
    for name, s in figures:
        for k in ("mean", "median", "std", "p90", "p95", "p99"):
            res[f"{k}_{name}_ms"] = s[k]
    res["max_itl_ms"] = itl_s["max"]
    tok = _stats(itl_tok) if split else itl_s
    for k in ("mean", "median", "p99"):
        res[f"{k}_itl_per_token_ms"] = tok[k]
    q = _stats(queue)
    res["mean_queue_time_ms"], res["p99_queue_time_ms"] = q["mean"], q["p99"]
    res["max_concurrent_requests"] = _max_concurrent(recs)
    res["concurrency"] = math.fsum(e2e) / 1e3 / duration if e2e else 0.0
    res["enginesim_replay"] = _profile(steps, res)
    return res


def _profile(steps: list[tuple[float, int]], res: dict[str, Any]) -> dict[str, Any]:
    """What the live emulator needs to pace this case: its length and event rate in emulated time."""
    emulated = math.fsum(c for c, _ in steps)
    rates = sorted(n / c for c, n in steps if c > 0)
    step_rates = sorted(1.0 / c for c, _ in steps if c > 0)
    costs = sorted(c for c, _ in steps)

    def ms_to_s(key: str) -> float | None:
        v = res.get(key)
        return v / 1e3 if isinstance(v, float) else None

    return {
        "emulated_s": emulated,
        "steps": len(steps),
        "events": sum(n for _, n in steps),
        "event_rate_mean": sum(n for _, n in steps) / emulated if emulated else 0.0,
        "event_rate_p95": _pct(rates, 95) or 0.0,
        "step_rate_p95": _pct(step_rates, 95) or 0.0,
        "step_p05_s": _pct(costs, 5) or 0.0,
        "first_step_s": steps[0][0] if steps else 0.0,
        "step_p50_s": _pct(costs, 50) or 0.0,
        "ttft_p50_s": ms_to_s("median_ttft_ms"),
        "itl_p50_s": ms_to_s("median_itl_ms"),
        "itl_p95_s": ms_to_s("p95_itl_ms"),
    }


# ---- command line -------------------------------------------------------------------------------------
def _positive(flag: str) -> Any:
    def conv(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {v!r}") from None
        if x < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be >= 1, got {x}")
        return x

    return conv


def _rate(v: str) -> float | None:
    if v.strip().lower() == "inf":
        return None
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--request-rate must be a number or 'inf', got {v!r}") from None
    if math.isinf(x):
        return None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"--request-rate must be > 0 (or 'inf'), got {v}")
    return x


def _shared(v: str) -> tuple[int, int]:
    parts = v.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--shared-prefix must be GROUPS:PREFIX_LEN (integers > 0), got {v!r}"
        )
    return int(parts[0]), int(parts[1])


def _inject(v: str) -> tuple[int, int, float]:
    lens, _, at = v.partition("@")
    parts = lens.split(":")
    try:
        isl, osl, t = int(parts[0]), int(parts[1]), float(at)
        ok = len(parts) == 2 and isl > 0 and osl > 0 and 0 <= t < math.inf
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"--inject must be ISL:OSL@SECONDS (integers > 0, emulated seconds >= 0), got {v!r}"
        )
    return isl, osl, t


def workload_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m enginesim replay", add_help=False, allow_abbrev=False)
    a = p.add_argument
    a("--isl", type=_positive("--isl"), required=True)
    a("--osl", type=_positive("--osl"), required=True)
    a("--concurrency", type=_positive("--concurrency"), default=None)
    a("--num-prompts", type=_positive("--num-prompts"), required=True)
    a("--request-rate", type=_rate, default=None)
    a("--seed", type=int, default=1)
    a("--shared-prefix", type=_shared, default=None, metavar="GROUPS:PREFIX_LEN")
    a("--inject", type=_inject, action="append", default=[], metavar="ISL:OSL@SECONDS")
    a("--prompt-format", choices=("ids", "text"), default="ids")
    return p


USAGE = (
    "usage: python -m enginesim replay {sglang <flags> | vllm serve <model> <flags>} --isl N --osl N "
    "[--concurrency N] --num-prompts N [--request-rate R] [--seed S] [--shared-prefix GROUPS:PREFIX_LEN] "
    "[--inject ISL:OSL@SECONDS]... [--prompt-format ids|text]\n"
)


def parse(argv: list[str]) -> tuple[cli.Config, Workload]:
    """`argv` after `replay`: the engine's own command line plus the workload flags. Exits 2 on bad input."""
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        raise SystemExit(0 if argv else 2)
    wp = workload_parser()
    ns, rest = wp.parse_known_args(argv)
    cfg = cli.parse(rest)
    if ns.shared_prefix and ns.shared_prefix[1] >= ns.isl:
        wp.error(f"--shared-prefix prefix length {ns.shared_prefix[1]} must be below --isl {ns.isl}")
    groups, plen = ns.shared_prefix or (0, 0)
    w = Workload(
        ns.isl,
        ns.osl,
        ns.concurrency,
        ns.num_prompts,
        ns.request_rate,
        ns.seed,
        groups,
        plen,
        tuple(ns.inject),
        ns.prompt_format,
    )
    return cfg, w


def main(argv: list[str]) -> int:
    cfg, w = parse(argv)
    t0 = time.perf_counter()
    try:
        res = run(cfg, w)
    except (capacity.StartupOOM, ValueError, RuntimeError) as e:
        sys.stderr.write(f"python -m enginesim replay: error: {e}\n")
        return 1
    res["enginesim_replay"]["replay_wall_s"] = round(time.perf_counter() - t0, 3)
    sys.stdout.write(json.dumps(res, separators=(",", ":")) + "\n")
    return 0
