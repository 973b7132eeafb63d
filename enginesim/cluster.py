"""Multi-node rendezvous over TCP: ranks > 0 join the head at --dist-init-addr and send heartbeats.

Why: quickmap starts worker ranks before the head and waits for /health, and its fault handling must
see what happens when a rank dies. The head is healthy only when every rank has joined; if a rank's
connection drops (or its heartbeats stop) the head logs an NCCL-style error, fails all requests and
reports 503 on /health from then on.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable

HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = 5.0


class Head:
    def __init__(self, nnodes: int, on_lost: Callable[[int, str], None], log: Callable[[str], None]) -> None:
        self.nnodes = nnodes
        self.joined: dict[int, str] = {}
        self.all_joined = asyncio.Event()
        self.on_lost = on_lost
        self.log = log
        if nnodes == 1:
            self.all_joined.set()

    async def start(self, addr: str) -> asyncio.base_events.Server:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        return await asyncio.start_server(self._client, host, int(port), reuse_address=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}<{peer[1]}>" if peer else "unknown"
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), 30))
            rank = int(hello["rank"])
        except (TimeoutError, ValueError, KeyError, TypeError, OSError):
            writer.close()
            return
        if not 0 < rank < self.nnodes or rank in self.joined:
            writer.write(
                json.dumps({"ok": False, "error": f"node rank {rank} invalid or already joined"}).encode()
                + b"\n"
            )
            writer.close()
            return
        self.joined[rank] = hello.get("host", peer_s)
        writer.write(json.dumps({"ok": True, "nnodes": self.nnodes}).encode() + b"\n")
        await writer.drain()
        self.log(
            f"node rank {rank} joined from {hello.get('host', '?')} "
            f"({len(self.joined) + 1}/{self.nnodes} nodes)"
        )
        if len(self.joined) == self.nnodes - 1:
            self.all_joined.set()
        while True:
            try:
                line = await asyncio.wait_for(reader.readline(), HEARTBEAT_TIMEOUT_S)
            except (TimeoutError, OSError):
                line = b""
            if not line:
                break
        self.joined.pop(rank, None)
        self.on_lost(rank, peer_s)


async def join(
    addr: str, rank: int, timeout_s: float, log: Callable[[str], None]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the head, retrying until it listens (workers start first), then say hello."""
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + timeout_s
    last_err = ""
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(
                json.dumps({"rank": rank, "host": socket.gethostname(), "pid": os.getpid()}).encode() + b"\n"
            )
            await writer.drain()
            reply = json.loads(await asyncio.wait_for(reader.readline(), 30) or b"{}")
            if reply.get("ok"):
                return reader, writer
            raise RuntimeError(reply.get("error", "rejected by head"))
        except (TimeoutError, OSError, ValueError) as e:
            last_err = str(e)
            await asyncio.sleep(0.3)
    raise TimeoutError(f"could not join the head at {addr} within {timeout_s:.0f} s: {last_err}")


async def heartbeat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Send heartbeats until the head goes away; returns why."""

    async def pinger() -> None:
        try:
            while True:
                writer.write(b"ping\n")
                await writer.drain()
                await asyncio.sleep(HEARTBEAT_S)
        except (OSError, RuntimeError):
            return

    task = asyncio.ensure_future(pinger())
    try:
        while True:
            line = await reader.readline()
            if not line:
                return "connection closed by the head"
    except OSError as e:
        return str(e)
    finally:
        task.cancel()
