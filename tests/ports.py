"""TCP ports for the servers tests start on 127.0.0.1, disjoint between pytest-xdist workers.

`bind(0)` hands out ports from the kernel's ephemeral range, which is also where every client socket
(loadgen, httpx, ssh) takes its source port; two workers probing at once could be given the same port
between the probe and the server's own bind. Each worker here probes its own block below that range,
starting at a random offset so that parallel checkouts on one box rarely meet either.
"""

from __future__ import annotations

import os
import random
import socket

FIRST_PORT = 20100  # above engine_dist_init_port (20000), below the ephemeral range (32768)
BLOCK = 3000
BLOCKS = 4


def worker_index() -> int:
    """0 for `gw0` (or no xdist), 1 for `gw1`, ...; folded into the available blocks."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) % BLOCKS if digits.isdigit() else 0


_next = random.randrange(BLOCK)


def free_port() -> int:
    """A port in this worker's block that nothing listens on right now; never the same one twice."""
    global _next
    base = FIRST_PORT + worker_index() * BLOCK
    for _ in range(BLOCK):
        port = base + _next % BLOCK
        _next += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {base}-{base + BLOCK - 1} (xdist worker block)")
