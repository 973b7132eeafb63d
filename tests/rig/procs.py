"""Process helpers for the rig: find, signal and reap processes strictly by PID.

The rig never kills by name: several engineers share this machine, so every process it ends is one it
started (sshd by the PID it spawned, its children found through /proc, the shim's engines by the PIDs
the shim recorded).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state field follows the parenthesised command name, which may itself contain spaces.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks after boot (stat field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def cmdline(pid: int) -> list[str]:
    """The argv of `pid`, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def parent_map() -> dict[int, int]:
    """pid -> ppid for every process visible in /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children first found, deepest last)."""
    parents = parent_map()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def terminate(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM each pid, wait up to `grace_s`, then SIGKILL the survivors. Returns the pids signalled."""
    signalled = []
    for pid in pids:
        if pid > 1 and pid != os.getpid() and alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(pid) for pid in signalled):
        time.sleep(0.05)
    for pid in signalled:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid in signalled:
        _reap(pid)
    return signalled


def _reap(pid: int) -> None:
    """Collect the exit status when `pid` is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
