"""NCCL INFO lines for multi-node runs (NCCL_DEBUG=INFO), in the formats NCCL 2.24+ prints.

Why: quickmap's NCCL gate decides from each node's server log whether NCCL really uses NET/IB on the
expected HCAs or silently fell back to sockets. The emulator prints what NCCL would print on this
host: IB on the HCAs named in NCCL_IB_HCA that exist in the host's HCA directory (default
/sys/class/infiniband), as real NCCL does (a missing one is skipped); when none exists,
`NET/IB : No device found.` followed by the socket fallback.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import threading

NCCL_VERSION = "2.27.5+cuda12.9"


def _natural(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def host_hcas(ib_dir: str) -> list[str]:
    try:
        return sorted((n for n in os.listdir(ib_dir) if not n.startswith(".")), key=_natural)
    except OSError:
        return []


def link_layer(ib_dir: str, dev: str, port: int) -> str:
    try:
        with open(os.path.join(ib_dir, dev, "ports", str(port), "link_layer")) as f:
            return "RoCE" if f.read().strip().lower() == "ethernet" else "IB"
    except OSError:
        return "IB"


def select_hcas(env_hca: str | None, devices: list[str]) -> list[tuple[str, int]] | None:
    """(device, port) pairs NCCL would use, or None when NET/IB finds no device.

    Real NCCL (net_ib.cc, ncclIbInit) walks the host's devices and keeps those the list matches: a
    named HCA that does not exist is skipped silently, so `=mlx5_0:1,mlx5_3:1` with mlx5_3 gone uses
    mlx5_0 alone; only when nothing matches does it print `NET/IB : No device found.`. `^` excludes;
    `=` is exact.
    """
    if not devices:
        return None
    if not env_hca:
        return [(d, 1) for d in devices]
    spec = env_hca.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    entries = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, rest = item.partition(":")
        port = int(rest.split(":")[0]) if rest.split(":")[0].isdigit() else 1
        entries.append((name, port))

    def matches(dev: str, name: str) -> bool:
        return dev == name if exact else dev.startswith(name)

    if exclude:
        kept = [(d, 1) for d in devices if not any(matches(d, n) for n, _ in entries)]
        return kept or None
    chosen: list[tuple[str, int]] = []
    for dev in devices:
        for name, port in entries:
            if matches(dev, name) and (dev, port) not in chosen:
                chosen.append((dev, port))
    return chosen or None


def _ifaddr(ifname: str) -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        s.close()


def oob_interface(env_ifname: str | None) -> tuple[str, str]:
    """The interface NCCL would pick for bootstrap/OOB: NCCL_SOCKET_IFNAME rules, else not lo/docker."""
    names = [n for _, n in socket.if_nameindex()]
    with_ip = [(n, ip) for n in names if (ip := _ifaddr(n))]
    if env_ifname and len(env_ifname) > 1:
        spec = env_ifname
        exclude = spec.startswith("^")
        spec = spec.lstrip("^")
        exact = spec.startswith("=")
        spec = spec.lstrip("=")
        prefixes = [p for p in spec.split(",") if p]

        def m(n: str) -> bool:
            return any(n == p if exact else n.startswith(p) for p in prefixes)

        pick = [(n, ip) for n, ip in with_ip if (not m(n) if exclude else m(n))]
        if pick:
            return pick[0]
    for n, ip in with_ip:
        if not n.startswith(("lo", "docker", "virbr")):
            return n, ip
    return with_ip[0] if with_ip else ("lo", "127.0.0.1")


def init_lines(
    env: dict[str, str], ib_dir: str, node_rank: int, nnodes: int, local_ranks: int, host: str | None = None
) -> list[str]:
    """Every NCCL INFO line one node prints while its communicator comes up (one block per local GPU)."""
    host = host or socket.gethostname()
    pid = os.getpid()
    ifname, ip = oob_interface(env.get("NCCL_SOCKET_IFNAME"))
    hca_env = env.get("NCCL_IB_HCA")
    devices = host_hcas(ib_dir)
    chosen = select_hcas(hca_env, devices)
    n_ranks = local_ranks * nnodes
    lines: list[str] = []
    for local in range(local_ranks):
        rank = node_rank * local_ranks + local
        # one process per GPU in the real engines: each local rank logs under its own pid
        rpid = pid + local
        tid = pid + 100 + local
        p = f"{host}:{rpid}:{tid} [{local}] NCCL INFO "
        if rank == 0:
            lines.append(p + f"NCCL version {NCCL_VERSION}")
        lines.append(p + f"Bootstrap: Using {ifname}:{ip}<0>")
        if env.get("NCCL_SOCKET_IFNAME"):
            lines.append(p + f"NCCL_SOCKET_IFNAME set by environment to {env['NCCL_SOCKET_IFNAME']}")
        lines.append(p + "NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.")
        if hca_env:
            lines.append(p + f"NCCL_IB_HCA set to {hca_env}")
        if chosen:
            devs = "".join(
                f" [{i}]{d}:{port}/{link_layer(ib_dir, d, port)}" for i, (d, port) in enumerate(chosen)
            )
            lines.append(p + f"NET/IB : Using{devs} ; OOB {ifname}:{ip}<0>")
            lines.append(p + "Using network IB")
            net = "IB"
        else:
            lines.append(p + "NET/IB : No device found.")
            lines.append(p + f"NET/IB : Using ; OOB {ifname}:{ip}<0>")
            lines.append(p + f"NET/Socket : Using [0]{ifname}:{ip}<0>")
            lines.append(p + "Using network Socket")
            net = "Socket"
        lines.append(
            p + f"comm 0x{0x55D0C0000000 + rank * 0x1000:x} rank {rank} nRanks {n_ranks} nNodes {nnodes} "
            f"localRanks {local_ranks} localRank {local} MNNVL 0"
        )
        peer = (rank + local_ranks) % n_ranks
        gdr = "/GDRDMA" if net == "IB" else ""
        lines.append(p + f"Channel 00/0 : {rank}[{local}] -> {peer}[{local}] [send] via NET/{net}/0{gdr}")
        lines.append(p + f"Channel 00/0 : {peer}[{local}] -> {rank}[{local}] [receive] via NET/{net}/0{gdr}")
        lines.append(
            p + f"ncclCommInitRankConfig comm 0x{0x55D0C0000000 + rank * 0x1000:x} rank {rank} nranks "
            f"{n_ranks} cudaDev {local} nvmlDev {local} busId {0x18 + local:x}000 commId "
            f"0x7e3b1c2d5a6f8e9{node_rank:x} - Init COMPLETE"
        )
    return lines


def peer_lost_lines(peer: str, host: str | None = None) -> list[str]:
    """What rank 0 prints when a remote rank vanishes (NCCL WARN + the torch/NCCL error)."""
    host = host or socket.gethostname()
    pid = os.getpid()
    tid = threading.get_native_id()
    return [
        f"{host}:{pid}:{tid} [0] transport/net_socket.cc:530 NCCL WARN NET/Socket : peer {peer} "
        "message truncated or connection closed by remote peer",
        f"{host}:{pid}:{tid} [0] include/socket.h:55 NCCL WARN socketProgress: "
        f"Connection closed by remote peer {peer}",
        f"{host}:{pid}:{tid} [0] NCCL INFO transport/net.cc:1296 -> 6",
    ]
