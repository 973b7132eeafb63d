"""Wake the event loop at an exact CLOCK_MONOTONIC nanosecond, without spinning.

asyncio's and uvloop's timers have millisecond granularity (uvloop turns a delay under 0.5 ms into
"call soon", so waiting for a deadline 0.3 ms away spins the loop, burning a CPU the client needs).
On Linux a timerfd armed at an absolute CLOCK_MONOTONIC time (``perf_counter_ns``'s clock) becomes
readable when the deadline passes, to within the process's timer slack, which is set to 1 µs here.
Elsewhere the loop's own timer is used.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from time import perf_counter_ns

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1
PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class Wakeup:
    """``arm(due_ns)`` calls ``callback`` once at ``due_ns`` (perf_counter_ns); re-arming replaces."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self.loop = loop
        self.callback = callback
        self.fd = -1
        self.handle: asyncio.TimerHandle | None = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
                fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
            except (OSError, AttributeError):
                fd = -1
            if fd >= 0:
                self.libc = libc
                self.fd = fd
                self.spec = _Itimerspec()
                libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
                loop.add_reader(fd, self._fired)

    def arm(self, due_ns: int) -> None:
        if self.fd >= 0:
            v = self.spec.it_value
            v.tv_sec, v.tv_nsec = divmod(max(due_ns, 1), 1_000_000_000)
            if self.libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None) != 0:
                raise OSError(ctypes.get_errno(), "timerfd_settime failed")
            return
        self.cancel()
        delay = (due_ns - perf_counter_ns()) / 1e9
        self.handle = self.loop.call_later(max(delay, 0.0), self.callback)

    def cancel(self) -> None:
        if self.fd >= 0:
            self.spec.it_value.tv_sec = self.spec.it_value.tv_nsec = 0
            self.libc.timerfd_settime(self.fd, 0, ctypes.byref(self.spec), None)
        elif self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # disarmed or re-armed after it became readable
            return
        self.callback()
