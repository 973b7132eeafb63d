"""The coordinator: forks the workers, runs warm-up then the main phase on a common start time.

The parent does no network I/O during a phase (it blocks on the workers' pipes), so it takes no
CPU away from the measuring loops. Requests are dealt round-robin to the workers and the
concurrency cap is split evenly between them (worker w holds cap//W, +1 for the first cap%W).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
from collections.abc import Callable
from time import perf_counter_ns

from .worker import WorkerSpec, worker_main

START_MARGIN_NS = 30_000_000  # the "go" message reaches every worker well before the start time


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived during the run."""


def split_cap(cap: int | None, workers: int) -> list[int | None]:
    if cap is None:
        return [None] * workers
    return [cap // workers + (1 if w < cap % workers else 0) for w in range(workers)]


class Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.on = sys.stderr.isatty() and total > 0
        self.last = 0.0

    def show(self, done: int, force: bool = False) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.25:
            return
        self.last = now
        w = 40
        k = int(w * done / self.total)
        sys.stderr.write(f"\r[{'#' * k}{'.' * (w - k)}] {done}/{self.total}")
        sys.stderr.flush()

    def end(self) -> None:
        if self.on:
            sys.stderr.write("\n")
            sys.stderr.flush()


class RunOutcome:
    """Raw records from every worker plus the phase times (all perf_counter_ns)."""

    def __init__(self) -> None:
        self.warm: list[tuple] = []
        self.main: list[tuple] = []
        self.lags: list[float] = []
        self.main_start_ns = 0
        self.main_over_ns = 0
        self.interrupted = False
        self.new_conns = 0
        self.unstamped_reads = 0  # --timestamps kernel: reads that came without a kernel stamp
        self.pool: list[tuple] = []  # (opened, wanted, first error) per worker
        self.worker_errors: list[str] = []


def run(
    host: str,
    port: int,
    backend: str,
    workers: int,
    cap: int | None,
    timeout_s: float,
    warm: list[tuple],
    main: list[tuple],
    before_main: Callable[[], None],
    use_uvloop: bool = True,
    kernel_ts: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> RunOutcome:
    """Fork ``workers`` processes, run warm-up (if any) and the main phase, collect the records.

    ``on_progress(completed, output_tokens_done)`` is called with the main phase's totals each time a
    worker reports (about every 0.5 s); it must be cheap (it runs between pipe reads).
    """
    out = RunOutcome()
    workers = max(1, min(workers, cap or workers, max(len(main), 1)))
    caps = split_cap(cap, workers)
    ctx = multiprocessing.get_context("fork")
    pipes = []
    procs = []
    for w in range(workers):
        spec = WorkerSpec(
            w,
            host,
            port,
            backend,
            caps[w],
            timeout_s,
            warm[w::workers],
            main[w::workers],
            use_uvloop,
            kernel_ts,
        )
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(target=worker_main, args=(spec, child_end), daemon=True)
        p.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(p)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    progress = Progress(len(main))
    done_counts = [0] * workers
    done_tokens = [0] * workers
    live = set(range(workers))

    def collect(kind: str, phase: str | None = None) -> list[tuple]:
        """Wait until every live worker sent ``kind``; returns those messages."""
        got: dict[int, tuple] = {}
        while len(got) < len(live):
            ready = multiprocessing.connection.wait([pipes[w] for w in live if w not in got], timeout=1.0)
            for c in ready:
                w = pipes.index(c)
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    out.worker_errors.append(f"worker {w} exited unexpectedly")
                    live.discard(w)
                    continue
                if msg[0] == "progress":
                    done_counts[w] = msg[2]
                    done_tokens[w] = msg[3]
                    if phase == "main":
                        progress.show(sum(done_counts))
                        if on_progress is not None:
                            on_progress(sum(done_counts), sum(done_tokens))
                elif msg[0] == "error":
                    out.worker_errors.append(f"worker {w}: {msg[2]}")
                    live.discard(w)
                elif msg[0] == kind:
                    got[w] = msg
        return list(got.values())

    def go(phase: str) -> int:
        start = perf_counter_ns() + START_MARGIN_NS
        for w in live:
            pipes[w].send(("go", phase, start))
        return start

    running: list[str] = []  # the phase the workers are in, if any
    try:
        try:
            for msg in collect("ready"):
                out.pool.append((msg[2], msg[3], msg[4]))
            if warm:
                running.append("warmup")
                go("warmup")
                for msg in collect("done", "warmup"):
                    out.warm.extend(msg[3])
                running.clear()
            before_main()
            running.append("main")
            out.main_start_ns = go("main")
            for msg in collect("done", "main"):
                out.main.extend(msg[3])
                out.lags.extend(msg[4])
                out.new_conns += msg[5]
                out.unstamped_reads += msg[7]
            out.main_over_ns = perf_counter_ns()
            progress.show(len(main), force=True)
        except KeyboardInterrupt:
            out.interrupted = True
            for w in live:
                with contextlib.suppress(OSError):
                    pipes[w].send(("stop",))
            # the workers cancel what is in flight and send what they measured
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            deadline = time.monotonic() + 10.0
            while live and running and time.monotonic() < deadline:
                ready = multiprocessing.connection.wait([pipes[w] for w in live], timeout=1.0)
                for c in ready:
                    w = pipes.index(c)
                    try:
                        msg = c.recv()
                    except (EOFError, OSError):
                        live.discard(w)
                        continue
                    if msg[0] == "done":
                        if msg[2] == "main":
                            out.main.extend(msg[3])
                            out.lags.extend(msg[4])
                            out.unstamped_reads += msg[7]
                        else:
                            out.warm.extend(msg[3])
                        live.discard(w)
                    elif msg[0] == "error":
                        live.discard(w)
            out.main_over_ns = perf_counter_ns()
        progress.end()
    finally:
        for w in range(workers):
            with contextlib.suppress(OSError):
                pipes[w].send(("exit",))
        for p in procs:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        signal.signal(signal.SIGTERM, old_term)
    return out
