"""The coordinator: forks the workers, runs warm-up then the main phase on a common start time.

The parent does no network I/O during a phase (it blocks on the workers' pipes), so it takes no
CPU away from the measuring loops. Requests are dealt round-robin to the workers and the
concurrency cap is split evenly between them (worker w holds cap//W, +1 for the first cap%W).

Interruption (SIGTERM/SIGINT, see ``Interrupted``) and a refusal before the main phase
(``RunRefused``) take the same way out: every worker is told to stop, each hands back the records
of its phase (finished requests, and the in-flight ones as ``cancelled``), and ``run`` returns what
came back within ``STOP_GRACE_S``, so the caller can still write the result within about 2 s.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from time import perf_counter_ns

from .records import Exit, Go, PhaseDone, Progress, Ready, RequestRecord, Stop, WorkerError
from .worker import WorkerSpec, worker_main

START_MARGIN_NS = 30_000_000  # the "go" message reaches every worker well before the start time
STOP_GRACE_S = 5.0  # after a stop, the longest the workers get to hand back their records
EXIT_GRACE_S = 0.5  # then how long they get to exit before they are killed
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived (raised once per run, see ``StopSignals``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class RunRefused(Exception):
    """``before_main`` refuses the main phase (e.g. the cache flush never succeeded)."""


class StopSignals:
    """SIGTERM/SIGINT for the parent: turned into one ``Interrupted``, raised where it is safe.

    While ``raising`` (plain Python code: making prompts, the HTTP calls before the main phase) the
    handler raises at once. Elsewhere (forking the workers, reading their pipes) it only notes the
    signal and wakes the parent's wait through a socket (``signal.set_wakeup_fd``); the wait then
    raises. A raise inside fork's at-fork hooks or halfway through a pipe read would be lost or
    would corrupt the pipe. Later signals are swallowed: ``timeout`` signals loadgen and then its
    whole process group, so loadgen gets each signal twice, and nothing may cut the hand-back short.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.raised = False
        self.raising = True
        self.rsock, self.wsock = socket.socketpair()
        self.rsock.setblocking(False)
        self.wsock.setblocking(False)

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handler)
        signal.set_wakeup_fd(self.wsock.fileno(), warn_on_full_buffer=False)

    def _handler(self, signum: int, frame) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self.raising:
            self.raised = True
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise the noted signal, once."""
        with contextlib.suppress(OSError):
            while self.rsock.recv(512):
                pass
        if self.signum is not None and not self.raised:
            self.raised = True
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def raising_here(self):
        """Plain code (no fork, no pipe read): a signal may raise at once, a noted one too."""
        old, self.raising = self.raising, True
        try:
            self.check()
            yield
        finally:
            self.raising = old

    def release_in_child(self) -> None:
        """In a forked worker: the parent's wake-up socket is not ours to write."""
        signal.set_wakeup_fd(-1)
        self.rsock.close()
        self.wsock.close()


def split_cap(cap: int | None, workers: int) -> list[int | None]:
    if cap is None:
        return [None] * workers
    return [cap // workers + (1 if w < cap % workers else 0) for w in range(workers)]


class ProgressBar:
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
        self.warm: list[RequestRecord] = []
        self.main: list[RequestRecord] = []
        self.lags: list[float] = []
        self.main_start_ns = 0
        self.main_over_ns = 0
        self.interrupted_by: str | None = None  # "SIGTERM" / "SIGINT" when a signal cut the run short
        self.refused: str | None = None  # why before_main refused the main phase
        self.new_conns = 0
        self.unstamped_reads = 0  # --timestamps kernel: reads that came without a kernel stamp
        self.pool: list[Ready] = []
        self.worker_errors: list[str] = []

    @property
    def cut_short(self) -> bool:
        return self.interrupted_by is not None or self.refused is not None


class _Workers:
    """The forked worker processes and the parent's ends of their pipes."""

    def __init__(self, specs: list[WorkerSpec], signals: StopSignals) -> None:
        self.signals = signals
        ctx = multiprocessing.get_context("fork")
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.procs = []
        child_ends = []
        for _ in specs:
            parent_end, child_end = ctx.Pipe()
            self.pipes.append(parent_end)
            child_ends.append(child_end)
        me = os.getpid()
        for w, spec in enumerate(specs):
            # the child closes every pipe end but its own, so the parent's death closes its pipe
            inherited = self.pipes + [c for k, c in enumerate(child_ends) if k != w]
            args = (spec, child_ends[w], me, inherited, signals.release_in_child)
            p = ctx.Process(target=worker_main, args=args, daemon=True)
            p.start()
            self.procs.append(p)
        for c in child_ends:
            c.close()
        self.live = set(range(len(specs)))

    def send(self, msg: object) -> None:
        for w in list(self.live):
            with contextlib.suppress(OSError):
                self.pipes[w].send(msg)

    def receive(self, timeout: float) -> list[tuple[int, object]]:
        """(worker, message) for every message that arrives within ``timeout``; a dead worker's
        pipe gives (worker, None) and the worker leaves ``live``. A stop signal ends the wait and
        raises ``Interrupted`` here, between messages, never inside one."""
        waiting = [self.pipes[w] for w in self.live]
        got = []
        ready = multiprocessing.connection.wait([*waiting, self.signals.rsock], timeout=timeout)
        self.signals.check()  # before any read: what the workers sent stays in the pipes for the stop
        for c in ready:
            if c is self.signals.rsock:
                continue
            w = self.pipes.index(c)
            try:
                got.append((w, c.recv()))
            except (EOFError, OSError):
                self.live.discard(w)
                got.append((w, None))
        return got

    def finish(self) -> None:
        """Tell every worker to exit, give them EXIT_GRACE_S together, then kill what is left."""
        self.send(Exit())
        deadline = time.monotonic() + EXIT_GRACE_S
        for p in self.procs:
            p.join(timeout=max(deadline - time.monotonic(), 0.01))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)


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
    signals: StopSignals,
    use_uvloop: bool = True,
    kernel_ts: bool = True,
) -> RunOutcome:
    """Fork ``workers`` processes, run warm-up (if any) and the main phase, collect the records.

    ``signals`` (installed by the caller) turns SIGTERM/SIGINT into ``Interrupted``; here that
    becomes a stop of the workers and ``interrupted_by`` on the outcome.
    """
    out = RunOutcome()
    workers = max(1, min(workers, cap or workers, max(len(main), 1)))
    caps = split_cap(cap, workers)
    specs = [
        WorkerSpec(w, host, port, backend, caps[w], timeout_s, warm[w::workers], main[w::workers],
                   use_uvloop, kernel_ts)
        for w in range(workers)
    ]  # fmt: skip
    bar = ProgressBar(len(main))
    done_counts = [0] * workers

    def collect(kind: type, phase: str | None = None) -> list:
        """Wait until every live worker sent a ``kind`` message; returns those messages."""
        got: dict[int, object] = {}
        while len(got) < len(pool.live):
            for w, msg in pool.receive(timeout=1.0):
                if msg is None:
                    out.worker_errors.append(f"worker {w} exited unexpectedly")
                elif isinstance(msg, Progress):
                    done_counts[w] = msg.done
                    if phase == "main":
                        bar.show(sum(done_counts))
                elif isinstance(msg, WorkerError):
                    out.worker_errors.append(f"worker {w}: {msg.message}")
                    pool.live.discard(w)
                elif isinstance(msg, kind):
                    got[w] = msg
        return list(got.values())

    def go(phase: str) -> int:
        start = perf_counter_ns() + START_MARGIN_NS
        pool.send(Go(phase, start))
        return start

    running: list[str] = []  # the phase the workers are in, if any
    signals.raising = False  # from here on the waits raise it (StopSignals): fork's hooks must not
    pool = _Workers(specs, signals)
    try:
        try:
            out.pool = collect(Ready)
            if warm:
                running.append("warmup")
                go("warmup")
                for msg in collect(PhaseDone, "warmup"):
                    out.warm.extend(msg.records)
                running.clear()
            with signals.raising_here():  # the caller's HTTP calls: plain code
                before_main()
            running.append("main")
            out.main_start_ns = go("main")
            for msg in collect(PhaseDone, "main"):
                take_main(out, msg)
                if msg.stopped:  # a signal to the worker alone, or its own stop
                    out.worker_errors.append(f"worker {msg.wid} stopped before the end of the main phase")
            out.main_over_ns = perf_counter_ns()
            bar.show(len(main), force=True)
        except (Interrupted, RunRefused) as exc:
            if isinstance(exc, Interrupted):
                out.interrupted_by = exc.name
            else:
                out.refused = str(exc)
            stop_and_collect(pool, out, running, exc)
        bar.end()
    finally:
        pool.finish()
    return out


def take_main(out: RunOutcome, msg: PhaseDone) -> None:
    out.main.extend(msg.records)
    out.lags.extend(msg.loop_lags_s)
    out.new_conns += msg.new_conns
    out.unstamped_reads += msg.unstamped_reads


def stop_and_collect(pool: _Workers, out: RunOutcome, running: list[str], why: BaseException) -> None:
    """Tell the workers to stop and take the records they hand back within STOP_GRACE_S."""
    reason = f"interrupted by {out.interrupted_by}" if out.interrupted_by else f"run refused: {why}"
    pool.send(Stop(reason))
    deadline = time.monotonic() + STOP_GRACE_S
    pending = set(pool.live) if running else set()
    while pending and time.monotonic() < deadline:
        try:
            got = pool.receive(timeout=max(deadline - time.monotonic(), 0.0))
        except Interrupted as exc:  # a signal during a refusal's hand-back: noted, the hand-back goes on
            out.interrupted_by = out.interrupted_by or exc.name
            continue
        for w, msg in got:
            if msg is None or isinstance(msg, WorkerError):
                pending.discard(w)
            elif isinstance(msg, PhaseDone):
                if msg.phase == "main":
                    take_main(out, msg)
                else:
                    out.warm.extend(msg.records)
                pending.discard(w)
    for w in sorted(pending):
        out.worker_errors.append(f"worker {w} did not hand back its records within {STOP_GRACE_S:g} s")
    out.main_over_ns = perf_counter_ns()
