"""NCCL log files of a collectives run: where each rank's log goes, and a copy fit to commit.

Why a trimmed copy: the logs are committed as parser fixtures, and an NCCL INFO line starts with the
host name (`host:pid:tid [dev] NCCL INFO ...`) and names the host's addresses on its Bootstrap and
socket lines. The copy replaces each host name with `node0`, `node1`, ... and each IPv4 address with
`10.0.0.N` (the same address always gets the same N); nothing else changes, so the copy parses exactly
as the original did. Standard library only.
"""

from __future__ import annotations

import os
import re

IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
PREFIX_HOST = re.compile(r"^(?P<pre>(?:\[[^\]]*\] )?)(?P<host>[^\s:\[\]]+)(?P<rest>:\d+:\d+ \[\d+\] )", re.M)


def rank_log(directory: str, world: int, rank: int) -> str:
    """`<dir>/tp<world>/rank<rank>.log`: one NCCL log per rank (NCCL_DEBUG_FILE)."""
    return os.path.join(directory, f"tp{world}", f"rank{rank}.log")


def trim_text(text: str, hosts: dict[str, str], addresses: dict[str, str]) -> str:
    """`text` with host names and IPv4 addresses replaced (the two maps grow as new ones appear)."""

    def host(m: re.Match[str]) -> str:
        name = m.group("host")
        if name not in hosts:
            hosts[name] = f"node{len(hosts)}"
        return m.group("pre") + hosts[name] + m.group("rest")

    def addr(m: re.Match[str]) -> str:
        a = m.group(0)
        if a.startswith("127.") or a == "0.0.0.0":
            return a
        if a not in addresses:
            addresses[a] = f"10.0.0.{len(addresses) + 1}"
        return addresses[a]

    text = PREFIX_HOST.sub(host, text)
    for name, alias in sorted(hosts.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(name, alias)
    return IPV4.sub(addr, text)


def trim_tree(src: str, dst: str) -> list[str]:
    """Trimmed copies of every `*.log` under `src` into `dst` (same layout); returns the files written."""
    hosts: dict[str, str] = {}
    addresses: dict[str, str] = {}
    written = []
    for root, _dirs, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(".log"):
                continue
            rel = os.path.relpath(os.path.join(root, name), src)
            out = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            with open(out, "w", encoding="utf-8") as f:
                f.write(trim_text(text, hosts, addresses))
            written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    """python -m enginesim.calibrate.nccl_files SRC DST: host-trimmed copies of SRC's *.log in DST."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not os.path.isdir(args[0]):
        print("usage: python -m enginesim.calibrate.nccl_files SRC_DIR DST_DIR", file=sys.stderr)
        return 2
    for path in trim_tree(args[0], args[1]):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
