"""A step's output waits for the step's deadline even on a connection that still has an earlier write
pending (a stream's header queued as its request arrived): only the earlier part may leave at once."""

from __future__ import annotations

import asyncio

from enginesim import httpserver
from enginesim.httpserver import HOLD, Conn, flush_held, flush_pending


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:  # pragma: no cover - keep-alive connection
        raise AssertionError("closed")


def test_a_step_output_is_not_flushed_with_an_earlier_pending_header() -> None:
    async def scenario() -> list[list[bytes]]:
        conn = Conn(lambda req, c: None)
        tr = _Transport()
        conn.connection_made(tr)  # type: ignore[arg-type]
        conn.start_stream()  # the request arrived: its header waits in PENDING
        HOLD[0] = True  # the engine applies the step that answers it, before the step's deadline
        try:
            conn.chunk(b"data: answer\n\n")
            conn.end_stream()
        finally:
            HOLD[0] = False
        seen = [list(tr.writes)]
        flush_pending()  # the loop's pending flush runs while the step's wall time passes
        seen.append(list(tr.writes))
        flush_held()  # the step's deadline
        seen.append(list(tr.writes))
        return seen

    try:
        at_apply, before_deadline, at_deadline = asyncio.run(scenario())
    finally:
        httpserver.PENDING.clear()
        httpserver.HELD.clear()
    early = b"".join(before_deadline)
    assert early.startswith(b"HTTP/1.1 200") and b"answer" not in early, early
    assert b"answer" in b"".join(at_deadline) and b"0\r\n\r\n" in at_deadline[-1], at_deadline
    assert b"answer" not in b"".join(at_apply)
