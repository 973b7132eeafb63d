"""The records that cross a process boundary: one request's raw timing, and the worker ↔ parent messages.

NamedTuples: they pickle as plain tuples (the pipe cost of the old anonymous tuples) and are read by
name. Times are ``perf_counter_ns`` (CLOCK_MONOTONIC, common to all processes on the host).
"""

from __future__ import annotations

from typing import NamedTuple


class RequestRecord(NamedTuple):
    """What a worker measured for one request (``results.request_record`` turns it into the result's form)."""

    index: int  # position in the main phase (warm-up requests: -1, -2, ...)
    sched_ns: int  # when it was due (phase start + its arrival offset)
    slot_ns: int  # when it got a concurrency slot
    send_ns: int  # request bytes handed to the socket (0: never sent)
    end_ns: int  # response over (last byte, or the failure)
    http_status: int | None
    error_class: str | None  # None = success; else http_status, connection, timeout, server_error, ...
    error: str | None
    ev_times: list[int]  # each content event's receive time
    event_tokens: list[int]  # tokens each content event carried
    output_tokens: int
    input_tokens: int
    tokens_source: str  # "server" (usage counts) or "client" (one per event)
    cached_tokens: int | None
    first_byte_ns: int
    enq_ns: int  # when it queued for a slot (0: a slot was free at its due time)
    spec: dict | None = None  # SGLang's speculative-decoding fields (meta_info spec_*), as written


# -- worker -> parent ------------------------------------------------------------------------------
class Ready(NamedTuple):
    """The worker's connection pool is open (or as open as it got)."""

    wid: int
    opened: int
    wanted: int
    error: str | None  # the first connect error, if any


class Progress(NamedTuple):
    wid: int
    done: int  # requests of the phase finished so far
    tokens: int = 0  # requested output tokens of the requests that ended without error (--progress-file)


class PhaseDone(NamedTuple):
    """A phase is over (finished, or stopped): everything the worker measured in it."""

    wid: int
    phase: str  # "warmup" | "main"
    records: list[RequestRecord]
    loop_lags_s: list[float]
    new_conns: int  # connections opened during the phase (none were pre-opened for them)
    stopped: bool  # the phase was cut short (stop message, signal, or the parent gone)
    unstamped_reads: int  # --timestamps kernel: reads that came without a kernel stamp


class WorkerError(NamedTuple):
    wid: int
    message: str


# -- parent -> worker ------------------------------------------------------------------------------
class Go(NamedTuple):
    phase: str
    start_ns: int


class Stop(NamedTuple):
    """Stop sending, cancel what is in flight, hand back the phase's records."""

    reason: str


class Exit(NamedTuple):
    pass
