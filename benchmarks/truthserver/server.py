"""The schedule and the truth log of one truthserver process (its connections: conn.py).

Streams that are due now wait in a round-robin queue; later deadlines wait in a heap behind one
timer. A pass sends one event per due stream and yields to the event loop after ``--slice-ms`` so
new requests are read on time. Each finished (or aborted) request becomes one line of the truth log.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import os
import resource
from collections import deque
from time import perf_counter_ns

from .stream import Settings, Stream, json_response
from .wakeup import Wakeup
from .words import WordText, stream_words

try:  # several times faster for the per-request log line; the standard library does the same job
    import orjson

    def _dumps(obj: dict) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover

    def _dumps(obj: dict) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


EARLY_NS = 20_000  # an event due within 20 µs is sent now (a wake-up costs about that much)
EMPTY_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
LOG_FLUSH_BYTES = 1 << 20


class Server:
    """The schedule of one serving process: streams due now (round robin) and a heap of later
    deadlines, on one timer; and its share of the truth log."""

    def __init__(self, s: Settings, log_path: str, proc: int, procs: int) -> None:
        self.s = s
        self.text = WordText(stream_words())
        self.ready: deque[Stream] = deque()
        self.heap: list[tuple[int, int, Stream]] = []
        self.seq = itertools.count()
        self.rids = itertools.count(proc, procs)  # unique over the processes
        self.loop = asyncio.get_running_loop()
        self.wakeup = Wakeup(self.loop, self.pump)
        self.timer_due = 0  # the deadline the wake-up is armed for (0: none)
        self.pump_queued = False
        self.active = 0
        self.logfd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.logbuf: list[bytes] = []
        self.logbytes = 0
        self.stats = {
            "requests": 0,
            "finished": 0,
            "aborted": 0,
            "events": 0,
            "tokens": 0,
            "unstamped_reads": 0,
        }
        self.busy_ns = 0

    # -- scheduling ------------------------------------------------------------------------------
    def admit(self, st: Stream) -> None:
        self.active += 1
        self.stats["requests"] += 1
        self.place(st, st.next_due())

    def place(self, st: Stream, due: int) -> None:
        if due <= perf_counter_ns() + EARLY_NS:
            self.ready.append(st)
            if not self.pump_queued:
                self.pump_queued = True
                self.loop.call_soon(self.pump)
        else:
            heapq.heappush(self.heap, (due, next(self.seq), st))
            self.arm(due)

    def arm(self, due: int) -> None:
        if self.pump_queued:
            return
        if self.timer_due and self.timer_due <= due:
            return
        self.timer_due = due
        self.wakeup.arm(due)

    def pump(self) -> None:
        """Send every due event, one per stream per round, yielding to the loop after a slice."""
        self.timer_due = 0
        self.pump_queued = False
        heap, ready = self.heap, self.ready
        popleft, append = ready.popleft, ready.append
        t0 = now = perf_counter_ns()
        limit = now + self.s.slice_ns
        sent = 0
        while True:
            horizon = now + EARLY_NS
            while heap and heap[0][0] <= horizon:
                append(heapq.heappop(heap)[2])
            if not ready:
                break
            for _ in range(len(ready)):
                st = popleft()
                if st.dead:
                    continue
                if st.conn.paused:
                    st.parked = True  # resume_writing() puts it back
                    continue
                due = st.emit(self)
                sent += 1
                if due < 0:
                    continue
                if due <= horizon:
                    append(st)
                else:
                    heapq.heappush(heap, (due, next(self.seq), st))
            now = perf_counter_ns()
            if now >= limit:
                break
        self.stats["events"] += sent
        self.busy_ns += now - t0
        if ready:
            if not self.pump_queued:
                self.pump_queued = True
                self.loop.call_soon(self.pump)
        elif heap:
            self.arm(heap[0][0])

    def resume(self, st: Stream) -> None:
        if st.parked and not st.dead:
            st.parked = False
            self.place(st, st.next_due())

    # -- the truth log ---------------------------------------------------------------------------
    def finish(self, st: Stream, done_ns: int, aborted: bool = False) -> None:
        st.dead = True
        self.active -= 1
        a = st.arrival_ns
        rec = st.rec
        rec["t_us"] = [round((t - a) / 1e3) for t in st.sends]
        rec["done_us"] = round((done_ns - a) / 1e3)
        rec["backlog"] = st.backlog
        rec["paused"] = st.conn.pause_count
        if aborted:
            rec["aborted"] = True
            self.stats["aborted"] += 1
        else:
            self.stats["finished"] += 1
            self.stats["tokens"] += st.n
        line = _dumps(rec) + b"\n"
        self.logbuf.append(line)
        self.logbytes += len(line)
        if self.logbytes > LOG_FLUSH_BYTES:
            self.flush_log()
        st.conn.stream_over(st)

    def flush_log(self) -> None:
        """Whole lines in one write: appends from several processes never interleave inside a line."""
        if self.logbuf:
            data = b"".join(self.logbuf)
            self.logbuf = []
            self.logbytes = 0
            view = memoryview(data)
            while view:
                view = view[os.write(self.logfd, view) :]

    def flush_every_second(self) -> None:
        self.flush_log()
        self.loop.call_later(1.0, self.flush_every_second)

    def close(self) -> dict:
        self.flush_log()
        os.close(self.logfd)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return dict(self.stats, cpu_s=ru.ru_utime + ru.ru_stime, busy_s=self.busy_ns / 1e9)


def static_gets(s: Settings, port: int) -> dict[bytes, bytes]:
    models = {
        "object": "list",
        "data": [
            {"id": s.model, "object": "model", "created": 0, "owned_by": "truthserver", "root": s.model}
        ],
    }
    info = {"model_path": s.model, "tokenizer_path": s.model, "is_generation": True}
    server_info = {
        "model_path": s.model,
        "served_model_name": s.model,
        "port": port,
        "version": "truthserver",
        "context_length": 1 << 20,
    }
    return {
        b"/health": EMPTY_OK,
        b"/health_generate": EMPTY_OK,
        b"/v1/models": json_response(models),
        b"/get_model_info": json_response(info),
        b"/model_info": json_response(info),
        b"/get_server_info": json_response(server_info),
        b"/server_info": json_response(server_info),
        b"/metrics": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n",
    }
