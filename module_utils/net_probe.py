# Copyright: quickmap contributors
# Apache-2.0
"""Who listens on a TCP port, and which processes own it (stdlib only, Linux /proc with a connect fallback).

Used by the ``port_free`` and ``server_stale`` modules. ``/proc/net/tcp{,6}`` lists the sockets of the
reading process's network namespace, which is what a server started on this host would collide with;
socket owners come from ``/proc/<pid>/fd`` (processes of other users are invisible unless root, so a
listener may have no known owner). Where /proc is missing, a TCP connect still detects a listener.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket

TCP_LISTEN = "0A"
WILDCARDS = ("0.0.0.0", "::")


def _hex_to_ipv4(text: str) -> str:
    return str(ipaddress.IPv4Address(bytes.fromhex(text)[::-1]))


def _hex_to_ipv6(text: str) -> str:
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def parse_proc_net_tcp(text: str, ipv6: bool = False) -> list[dict]:
    """Listening sockets of one /proc/net/tcp[6] text -> ``[{"addr", "port", "inode"}]``."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        addr_hex, port_hex = fields[1].split(":")
        addr = _hex_to_ipv6(addr_hex) if ipv6 else _hex_to_ipv4(addr_hex)
        out.append({"addr": addr, "port": int(port_hex, 16), "inode": int(fields[9])})
    return out


def listeners(port: int, proc: str = "/proc") -> list[dict] | None:
    """Listening sockets on ``port`` from /proc; None when /proc/net/tcp cannot be read."""
    found: list[dict] = []
    readable = False
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(os.path.join(proc, "net", name)) as handle:
                text = handle.read()
        except OSError:
            continue
        readable = True
        found += [s for s in parse_proc_net_tcp(text, ipv6=v6) if s["port"] == port]
    return found if readable else None


def socket_owners(inodes: set[int], proc: str = "/proc") -> dict[int, list[dict]]:
    """Map socket inode -> ``[{"pid", "cmdline"}]`` for the processes we may inspect."""
    owners: dict[int, list[dict]] = {}
    if not inodes:
        return owners
    wanted = {f"socket:[{i}]": i for i in inodes}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return owners
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], []).append(
                    {"pid": int(pid), "cmdline": cmdline(int(pid), proc)}
                )
                break
    return owners


def cmdline(pid: int, proc: str = "/proc") -> str:
    """The command line of ``pid`` as one string ('' when unreadable)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (even one we may not signal)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def can_connect(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a TCP connection to host:port is accepted (something listens there)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _name, addr in infos:
        with contextlib.closing(socket.socket(family, kind, proto)) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(addr)
            except OSError:
                continue
            return True
    return False


def conflicts(listener_addr: str, host: str) -> bool:
    """Would a server binding ``host`` collide with a listener on ``listener_addr`` (same port)?"""
    return host in WILDCARDS or listener_addr in WILDCARDS or listener_addr == host


def probe_port(host: str, port: int, timeout: float = 1.0) -> dict:
    """Everything known about listeners on ``port`` that collide with binding ``host``.

    ``{"in_use": bool, "listeners": [{"addr", "port", "pids": [{"pid", "cmdline"}]}], "connect": bool,
    "method": "proc+connect" | "connect"}``.
    """
    found = listeners(port)
    target = "127.0.0.1" if host in WILDCARDS else host
    connected = can_connect(target, port, timeout)
    result: dict = {"method": "proc+connect" if found is not None else "connect", "connect": connected}
    hits = [s for s in (found or []) if conflicts(s["addr"], host)]
    owners = socket_owners({s["inode"] for s in hits})
    result["listeners"] = [
        {"addr": s["addr"], "port": s["port"], "pids": owners.get(s["inode"], [])} for s in hits
    ]
    result["in_use"] = bool(hits) or connected
    return result


def describe(listener: dict) -> str:
    """``0.0.0.0:30000 (pid 42: python -m enginesim ...)`` for messages."""
    who = ", ".join(f"pid {p['pid']}: {p['cmdline'][:160] or '?'}" for p in listener["pids"])
    return f"{listener['addr']}:{listener['port']}" + (f" ({who})" if who else " (owner not visible)")
