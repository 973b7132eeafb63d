"""Network namespaces, bridges and veth pairs for the rig (thin wrappers over iproute2's `ip`).

Every object the rig creates carries the prefix `qmr` plus the rig id, so a later run can find and remove
what a crashed run left behind without touching anything else on the machine.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

PREFIX = "qmr"


class NetnsError(RuntimeError):
    """An `ip` command failed; the message carries the command and its stderr."""


def ip_binary() -> str:
    """Path of iproute2's `ip`, or raise when it is missing."""
    found = shutil.which("ip") or ("/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else None)
    if not found:
        raise NetnsError("iproute2 `ip` not found (run tests/rig/install_system_deps.sh)")
    return found


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; raise NetnsError naming the command when it fails and `check` is set."""
    proc = subprocess.run([ip_binary(), *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def list_namespaces() -> list[str]:
    """Names of all network namespaces (`ip netns list` prints `name (id: N)`)."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Names of the links in the root namespace (without the `@peer` suffix)."""
    out = ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def probe() -> str | None:
    """None when this process may create namespaces and bridges; otherwise the reason it cannot."""
    try:
        ip_binary()
    except NetnsError as err:
        return str(err)
    name = f"{PREFIX}probe{os.getpid() % 100000}"
    try:
        ip("netns", "add", name)
    except NetnsError as err:
        return f"cannot create network namespaces here: {err}"
    ip("netns", "del", name, check=False)
    return None


def used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks already routed or assigned in the root namespace."""
    nets = []
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        for token in line.split():
            if "/" in token and token[0].isdigit():
                nets.append(ipaddress.ip_interface(token).network)
    for line in ip("-4", "route", "show", check=False).stdout.splitlines():
        token = line.split()[0] if line.split() else ""
        if token and token[0].isdigit():
            nets.append(ipaddress.ip_network(token if "/" in token else f"{token}/32", strict=False))
    return nets


def pick_subnet(seed: int, base: str = "10.213") -> ipaddress.IPv4Network:
    """A /24 under `base` that nothing on this machine uses yet (parallel rigs pick different ones)."""
    used = used_networks()
    for step in range(250):
        third = (seed + step) % 250 + 1
        candidate = ipaddress.ip_network(f"{base}.{third}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetnsError(f"no free /24 under {base}.0.0/16")


def create_bridge(name: str, address: str | None) -> None:
    """A Linux bridge in the root namespace, up, optionally with an address (the controller's side)."""
    ip("link", "add", name, "type", "bridge")
    ip("link", "set", name, "up")
    if address:
        ip("addr", "add", address, "dev", name)


def create_namespace(name: str) -> None:
    """A network namespace with its loopback up."""
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")


def attach(ns: str, bridge: str, root_end: str, ns_ifname: str, address: str) -> None:
    """A veth pair: `root_end` on `bridge`, its peer `ns_ifname` inside `ns` with `address`."""
    ip("link", "add", root_end, "type", "veth", "peer", "name", ns_ifname, "netns", ns)
    ip("link", "set", root_end, "master", bridge, "up")
    ip("-n", ns, "addr", "add", address, "dev", ns_ifname)
    ip("-n", ns, "link", "set", ns_ifname, "up")


def namespace_pids(ns: str) -> list[int]:
    """PIDs of the processes living in namespace `ns`."""
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def delete_namespace(ns: str) -> None:
    """Remove `ns` (its veth ends vanish with it)."""
    if ns in list_namespaces():
        ip("netns", "del", ns, check=False)


def delete_link(name: str) -> None:
    """Remove a root-namespace link when it exists."""
    if name in list_links():
        ip("link", "del", name, check=False)
