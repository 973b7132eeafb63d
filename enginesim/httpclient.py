"""A minimal asyncio HTTP/1.1 client for the emulator's own hops: the decode side's bootstrap handshake
with the prefill side, and the P/D router's forwarding (disagg.py, pd_router.py).

Why not urllib: these hops run inside the server's event loop, many at once, and the router relays a
chunked SSE stream chunk by chunk. One connection per request (`Connection: close`), no redirects, no
proxies (the hops are loopback or a private network, like the engines' own).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HopError(Exception):
    """The peer could not be reached or broke the connection (what a dead peer looks like)."""


def split_url(url: str) -> tuple[str, int]:
    """`http://host:port[/...]` -> (host, port); anything else is refused naming the value."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r} must be http://HOST:PORT")
    return parts.hostname, parts.port


class Upstream:
    """One request to a peer: `status` and `headers` after `open`, then the body via `body` or `chunks`."""

    def __init__(self, host: str, port: int, method: str, path: str, body: bytes = b"") -> None:
        self.host, self.port, self.method, self.path, self.payload = host, port, method, path, body
        self.status = 0
        self.headers: dict[str, str] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self, timeout: float) -> None:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout
            )
            head = (
                f"{self.method} {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(self.payload)}\r\n"
                "connection: close\r\n\r\n"
            ).encode()
            self._writer.write(head + self.payload)
            await self._writer.drain()
            raw = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
            self.close()
            raise HopError(f"{self.host}:{self.port}: {type(e).__name__}: {e}") from None
        lines = raw.decode("latin-1").split("\r\n")
        try:
            self.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self.close()
            raise HopError(f"{self.host}:{self.port}: malformed status line {lines[0]!r}") from None
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k:
                self.headers[k.strip().lower()] = v.strip()

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body piece by piece: each chunk of a chunked body, or the whole body."""
        assert self._reader is not None
        try:
            if not self.chunked:
                n = self.headers.get("content-length")
                yield await (self._reader.readexactly(int(n)) if n else self._reader.read())
                return
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    return
                data = await self._reader.readexactly(size + 2)
                yield data[:-2]
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise HopError(f"{self.host}:{self.port}: body broken: {type(e).__name__}: {e}") from None
        finally:
            self.close()

    async def body(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


async def fetch(
    host: str, port: int, method: str, path: str, body: bytes = b"", timeout: float = 30.0
) -> tuple[int, bytes]:
    """One whole request: (status, body). Raises HopError when the peer is unreachable or breaks off."""
    up = Upstream(host, port, method, path, body)
    await up.open(timeout)
    return up.status, await asyncio.wait_for(up.body(), timeout)
