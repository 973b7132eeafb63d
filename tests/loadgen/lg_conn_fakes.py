"""Stand-ins for what a loadgen ``Conn`` talks to (its owner and its transport) plus HTTP chunk framing,
so parser tests can feed it bytes directly (a uniquely named module, like lg_helpers)."""

from __future__ import annotations


class FakeOwner:
    """Collects finished requests, as the worker would."""

    def __init__(self) -> None:
        self.done = []

    def request_done(self, conn, req) -> None:
        self.done.append(req)

    def conn_closed(self, conn) -> None:
        pass


class FakeTransport:
    """Swallows writes; the bytes of the response are fed to ``Conn.on_data`` by the test."""

    def write(self, data) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def chunk(b: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame."""
    return b"%x\r\n%s\r\n" % (len(b), b)
