"""One load-generating worker: an event loop that owns a share of the connections and requests.

The parent process (runner.py) forks N of these so that reading thousands of streams is not bound
to one Python thread. Each worker pre-opens its connections, then waits for ``Go`` with an absolute
start time (``perf_counter_ns`` is CLOCK_MONOTONIC, shared by all processes on the host), sends
every request at its scheduled absolute time (no drift), holds its share of the concurrency cap,
and returns raw timing records (``records.RequestRecord``). JSON decoding of the streams happens
after the phase unless the stored events grow past a memory budget.

Stopping: a ``Stop`` message, SIGTERM or SIGINT (to the worker itself or to its whole process group,
as ``timeout`` and Ctrl-C send them) all end the phase the same way: no new request is sent, the
ones in flight are cancelled (class ``cancelled``, with the events they had received), and the
phase's records go to the parent. A worker never outlives its parent: the kernel sends it SIGTERM
when the parent dies (PR_SET_PDEATHSIG), and a closed pipe stops it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from time import perf_counter, perf_counter_ns

from .backends import Req, make_req
from .httpconn import Conn, KConn
from .records import Exit, Go, PhaseDone, Progress, Ready, RequestRecord, Stop, WorkerError

# keep stored raw events below this many bytes per worker; past it, parse at request completion
RAW_EVENT_BUDGET = 256 * 1024 * 1024
LAG_INTERVAL_S = 0.005
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WorkerSpec:
    """Everything one worker needs; inherited through fork, never pickled."""

    def __init__(
        self,
        wid: int,
        host: str,
        port: int,
        backend: str,
        cap: int | None,
        timeout_s: float,
        warm: list[tuple],
        main: list[tuple],
        use_uvloop: bool = True,
        kernel_ts: bool = True,
    ) -> None:
        self.wid = wid
        self.host = host
        self.port = port
        self.backend = backend
        self.cap = cap
        self.timeout_s = timeout_s
        self.warm = warm  # (index, sched_offset_ns, payload, input_len, output_len)
        self.main = main
        self.use_uvloop = use_uvloop
        self.kernel_ts = kernel_ts


def record_of(req: Req) -> RequestRecord:
    """What the parent gets for one request (fields: ``records.RequestRecord``)."""
    return RequestRecord(
        req.index,
        req.sched_ns,
        req.slot_ns,
        req.send_ns,
        req.end_ns,
        req.http_status,
        req.error_class,
        req.error,
        req.ev_times,
        req.event_tokens,
        req.output_tokens,
        req.input_tokens,
        req.tokens_source,
        req.cached_tokens,
        req.first_byte_ns,
        req.enq_ns,
        req.spec,
    )


class Worker:
    """Dispatches requests on absolute time over a pool of keep-alive connections."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        self.idle: list[Conn] = []
        self.all_conns: set[Conn] = set()
        self.inflight = 0
        self.inflight_reqs: set[Req] = set()
        self.ready: deque[Req] = deque()
        self.finished: list[Req] = []
        self.ndone = 0
        self.tokens_done = 0  # requested output tokens of requests that ended without error (progress)
        self.nstarted = 0
        self.total = 0
        self.dispatch_over = False
        self.stopping = False
        self.phase_fut: asyncio.Future | None = None
        self.raw_bytes = 0
        self.parse_now = False
        self.lags: list[float] = []
        self.new_conns_during_phase = 0
        self.opening: asyncio.Task | None = None  # the pool being opened (a stop cancels it)

    # -- connections ---------------------------------------------------------------------------
    async def _open(self) -> Conn:
        if self.spec.kernel_ts:
            conn = await KConn.open(self, self.loop, self.spec.host, self.spec.port)
        else:
            _, conn = await self.loop.create_connection(lambda: Conn(self), self.spec.host, self.spec.port)
        self.all_conns.add(conn)
        return conn

    async def open_pool(self, n: int) -> tuple[int, str | None]:
        """Pre-open ``n`` connections (so no connect happens inside a measured request)."""
        sem = asyncio.Semaphore(128)
        err: list[str] = []

        async def one() -> None:
            async with sem:
                try:
                    conn = await asyncio.wait_for(self._open(), self.spec.timeout_s)
                    self.idle.append(conn)
                except (TimeoutError, OSError) as exc:
                    err.append(f"{type(exc).__name__}: {exc}")

        await asyncio.gather(*(one() for _ in range(n)))
        return len(self.idle), (err[0] if err else None)

    def conn_closed(self, conn: Conn) -> None:
        self.all_conns.discard(conn)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    # -- requests ------------------------------------------------------------------------------
    def _start(self, req: Req) -> None:
        req.slot_ns = perf_counter_ns()
        self.inflight += 1
        self.nstarted += 1
        self.inflight_reqs.add(req)
        req.timer = self.loop.call_later(self.spec.timeout_s, self._timeout, req)
        self._send(req)

    def _send(self, req: Req) -> None:
        """On a kept-alive idle connection when there is one, else on a new one."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                req.conn = conn
                conn.send(req, req.payload)
                return
        self.new_conns_during_phase += 1
        self.loop.create_task(self._open_and_send(req))

    async def _open_and_send(self, req: Req) -> None:
        try:
            remaining = self.spec.timeout_s - (perf_counter_ns() - req.slot_ns) / 1e9
            conn = await asyncio.wait_for(self._open(), max(remaining, 0.001))
        except (TimeoutError, OSError) as exc:
            req.error_class = "timeout" if isinstance(exc, asyncio.TimeoutError) else "connection"
            req.error = f"connect failed: {type(exc).__name__}: {exc}"
            req.send_ns = req.end_ns = perf_counter_ns()
            self.request_done(None, req)
            return
        if req.error_class is not None:  # cancelled while connecting
            req.send_ns = req.end_ns = perf_counter_ns()
            self.idle.append(conn)
            self.request_done(None, req)
            return
        conn.fresh = True
        req.conn = conn
        conn.send(req, req.payload)

    def _timeout(self, req: Req) -> None:
        req.timer = None
        conn = req.conn
        msg = f"no complete response within --request-timeout {self.spec.timeout_s:g} s"
        if conn is not None:
            conn.fail("timeout", msg)
        elif req.error_class is None:
            req.error_class = "timeout"
            req.error = msg

    def request_done(self, conn: Conn | None, req: Req) -> None:
        """Called by a connection when its request is over (success or failure)."""
        if (
            req.error_class == "connection"
            and conn is not None
            and not conn.got_bytes
            and (conn.served > 1 or not conn.fresh)
            and not req.retried
            and not self.stopping
        ):
            # a kept-alive connection the server closed while idle (uvicorn drops them after 5 s)
            # and we raced it: resend once on another connection, as HTTP clients do
            self._retry(req)
            return
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        req.conn = None
        req.payload = b""
        self.inflight -= 1
        self.ndone += 1
        if req.error_class is None:
            self.tokens_done += req.expected_output
        self.inflight_reqs.discard(req)
        if conn is not None and not conn.closed:
            self.idle.append(conn)
        req.seal()
        if self.parse_now:
            req.analyse()
        else:
            self.raw_bytes += req.raw_size()
            if self.raw_bytes > RAW_EVENT_BUDGET:
                self.parse_now = True
                for r in self.finished:
                    if r.has_raw():
                        r.analyse()
                req.analyse()
        self.finished.append(req)
        cap = self.spec.cap
        ready = self.ready
        while ready and not self.stopping and (cap is None or self.inflight < cap):
            self._start(ready.popleft())
        self._check_over()

    def _retry(self, req: Req) -> None:
        req.retried = True
        req.error_class = req.error = req.http_status = None
        req.reset_raw()
        req.first_byte_ns = req.header_ns = req.end_ns = 0
        req.conn = None
        self._send(req)

    def _check_over(self) -> None:
        fut = self.phase_fut
        if fut is None or fut.done() or not self.dispatch_over or self.inflight:
            return
        if self.stopping or (self.ndone >= self.total and not self.ready):
            fut.set_result(None)

    def stop(self, reason: str) -> None:
        """Stop dispatching, cancel what is in flight (recorded as 'cancelled'); idempotent."""
        if self.stopping:
            return
        self.stopping = True
        self.ready.clear()
        msg = f"cancelled: {reason}"
        for req in list(self.inflight_reqs):
            if req.conn is not None:
                req.conn.fail("cancelled", msg)
            elif req.error_class is None:
                req.error_class = "cancelled"
                req.error = msg
        if self.opening is not None:
            self.opening.cancel()
        self._check_over()

    async def _lag_monitor(self) -> None:
        lags = self.lags
        target = perf_counter() + LAG_INTERVAL_S
        while True:
            await asyncio.sleep(max(target - perf_counter(), 0.0))
            now = perf_counter()
            lags.append(now - target)
            target = now + LAG_INTERVAL_S

    async def run_phase(
        self, items: list[tuple], start_ns: int
    ) -> tuple[list[RequestRecord], list[float], int]:
        """Send ``items`` on their schedule from ``start_ns``; return (records, loop lags, new conns)."""
        backend = self.spec.backend
        reqs = []
        for index, off, payload, ilen, olen in items:
            r = make_req(backend, index, payload, ilen, olen)
            r.sched_ns = start_ns + off
            reqs.append(r)
        self.finished = []
        self.ndone = self.nstarted = self.tokens_done = 0
        self.total = len(reqs)
        self.dispatch_over = False
        self.phase_fut = self.loop.create_future()
        self.lags = []
        self.new_conns_during_phase = 0
        self.raw_bytes = 0
        self.parse_now = False
        mon = self.loop.create_task(self._lag_monitor())
        gc_was = gc.isenabled()
        gc.disable()  # a collection pause would land in some stream's timestamps
        try:
            cap = self.spec.cap
            for r in reqs:
                if self.stopping:
                    break
                delay = r.sched_ns - perf_counter_ns()
                while delay > 0 and not self.stopping:  # uvloop timers may fire up to 1 ms early
                    await asyncio.sleep(delay / 1e9)
                    delay = r.sched_ns - perf_counter_ns()
                if self.stopping:
                    break
                if cap is not None and (self.inflight >= cap or self.ready):
                    r.enq_ns = perf_counter_ns()
                    self.ready.append(r)
                else:
                    self._start(r)
            if self.stopping:
                self.total = self.nstarted
            self.dispatch_over = True
            self._check_over()
            await self.phase_fut
        finally:
            mon.cancel()
            if gc_was:
                gc.enable()
        for r in self.finished:
            if r.has_raw():
                r.analyse()
        recs = [record_of(r) for r in self.finished]
        self.finished = []
        return recs, self.lags, self.new_conns_during_phase

    def close(self) -> None:
        for c in list(self.all_conns):
            if c.transport is not None:
                c.transport.close()


async def _serve(spec: WorkerSpec, pipe) -> None:
    loop = asyncio.get_running_loop()
    worker = Worker(spec)
    inbox: asyncio.Queue = asyncio.Queue()

    def on_pipe() -> None:
        try:
            while pipe.poll():
                msg = pipe.recv()
                if isinstance(msg, Stop):
                    worker.stop(msg.reason)
                inbox.put_nowait(msg)
        except (EOFError, OSError):  # the parent is gone
            worker.stop("the parent process is gone")
            inbox.put_nowait(Exit())
            loop.remove_reader(pipe.fileno())

    def on_signal(signum: int) -> None:
        worker.stop(f"interrupted by {signal.Signals(signum).name}")

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    if _PENDING_SIGNAL:  # arrived before the loop took the signals over
        on_signal(_PENDING_SIGNAL[0])
    loop.add_reader(pipe.fileno(), on_pipe)
    # the loop made the socketpair non-blocking; big result messages need blocking sends (reads
    # only happen after poll() said data is there)
    os.set_blocking(pipe.fileno(), True)
    n_main = len(spec.main)
    want = min(spec.cap if spec.cap is not None else 64, max(n_main, len(spec.warm)))
    worker.opening = loop.create_task(worker.open_pool(want))
    try:
        opened, err = await worker.opening
    except asyncio.CancelledError:
        opened, err = len(worker.idle), "stopped while opening connections"
    worker.opening = None
    pipe.send(Ready(spec.wid, opened, want, err))

    async def progress() -> None:
        while True:
            await asyncio.sleep(0.5)
            pipe.send(Progress(spec.wid, worker.ndone, worker.tokens_done))

    while True:
        msg = await inbox.get()
        if isinstance(msg, Exit):
            break
        if isinstance(msg, Go):
            items = spec.warm if msg.phase == "warmup" else spec.main
            ptask = loop.create_task(progress())
            try:
                recs, lags, newc = await worker.run_phase(items, msg.start_ns)
            finally:
                ptask.cancel()
            pipe.send(Progress(spec.wid, worker.ndone, worker.tokens_done))  # the final counts
            done = PhaseDone(spec.wid, msg.phase, recs, lags, newc, worker.stopping, KConn.unstamped_reads)
            pipe.send(done)
    worker.close()


_PENDING_SIGNAL: list[int] = []


def _note_signal(signum: int, frame) -> None:
    _PENDING_SIGNAL.append(signum)


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent exits; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(4)


def worker_main(
    spec: WorkerSpec, pipe, parent_pid: int, inherited: list, release: Callable[[], None]
) -> None:
    """Process entry point (forked). ``inherited``: pipe ends of the parent (and of the other workers)
    that fork copied into this process; closed here so that the parent's death closes our pipe.
    ``release`` drops what fork copied of the parent's signal handling (its wake-up socket)."""
    for sig in STOP_SIGNALS:  # until the event loop takes them over
        signal.signal(sig, _note_signal)
    release()
    die_with_parent(parent_pid)
    for conn in inherited:
        conn.close()
    run = asyncio.run
    if spec.use_uvloop:
        try:
            import uvloop

            run = uvloop.run
        except ImportError:
            pass
    try:
        run(_serve(spec, pipe))
    except BrokenPipeError:  # the parent is gone: nobody to hand the records to
        os._exit(4)
    except BaseException as exc:  # report, never hang the parent
        import traceback

        traceback.print_exc()
        with contextlib.suppress(OSError):
            pipe.send(WorkerError(spec.wid, f"{type(exc).__name__}: {exc}"))
        os._exit(3)
    os._exit(0)
