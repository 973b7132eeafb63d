# Copyright: quickmap contributors
# Apache-2.0
"""Parse NCCL_DEBUG=INFO lines from a server log and judge which network transport NCCL chose.

Pure code (no I/O): the ``nccl_transport`` module reads the files and feeds lines in, so the same
parser serves unit tests, the module's polling loop and any controller-side tool. The regexes follow
the NCCL source from 2.18 to HEAD (see docs/engine-surfaces.md, NCCL section): the line
prefix, ``NET/IB : Using [i]dev:port/LL ; OOB if:addr<port>``, ``NET/IB : No device found.``,
``NET/Socket : Using [i]if:addr<port>``, ``Using network X`` and the channel lines.

The verdict is fail-closed: anything other than a positive proof (NET/IB on exactly the expected HCAs
and ``Using network IB``) is either "pending" (maybe more lines will come) or a failure naming the rule.

Intra-node lines (checked against real single-node logs quoted in public reports, listed in
tests/modules/fixtures/nccl_intra/README.md): the transport of every connection
(``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read``,
``via P2P/IPC``, ``via P2P/direct pointer/read``, ``Channel 00 : 3[3] -> 0[0] via
SHM/direct/direct``, the 2.7-era ``Ring 00 : a[bus] -> b[bus] via P2P/IPC``), the communicator's span
(``comm 0x.. rank 0 nRanks 8 nNodes 1 localRanks 8``), ring order lines (``Channel 00/24 :  0 1 2 3``),
``Connected all rings`` / ``trees``, channel counts (``24 coll channels, 0 collnet channels, 0 nvls
channels, 32 p2p channels, 32 p2p channels per peer``) and NVLS (``NVLS multicast support is [not]
available``, ``Connected NVLS``). NCCL initialises its network plugin on a single node too (``NET/IB :
Using`` and ``Using network IB`` appear with no inter-node traffic at all), so an IB gate also needs a
connection that goes ``via NET/``; an intra-node gate (``require="intra"``) needs connections and none of
them over the network.
"""

from __future__ import annotations

import re

# --- Line grammar (NCCL src/debug.cc, net_ib, net_socket, init.cc, net.cc) -------------------------

# Not anchored at the start: NCCL writes with fprintf and other processes may glue text in front of it.
NCCL_PREFIX = re.compile(
    r"(?:\[(?P<ts>[^\]]+)\] )?(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<src>\S+:\d+)(?: \([^)]*\))? )?NCCL (?P<lvl>INFO|WARN|TRACE|CALL) ?(?P<msg>.*)$"
)
NCCL_VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)\+cuda(?P<cuda>\d+\.\d+)")
NET_IB_USING = re.compile(
    r"NET/IB ?: Using(?P<devs>.*?)\s*(?P<ro>\[RO\])?; "
    r"OOB (?P<oobif>[^\s:]+):(?P<oobaddr>\S+)<(?P<oobport>\d+)>\s*$"
)
NET_IB_DEV = re.compile(
    r"\[(?P<idx>\d+)\] ?(?P<dev>[A-Za-z0-9_.\-]+):(?P<port>\d+)(?::(?P<rail>\d*))?(?::(?P<plane>\d+))?"
    r"/(?P<ll>IB|RoCE|UNSPECIFIED)"
)
NET_IB_NONE = re.compile(r"NET/IB ?: No device found\.")
NET_SOCKET = re.compile(r"NET/Socket ?: Using(?P<devs>(?: \[\d+\][^\s:]+:\S+<\d+>)+)\s*$")
NET_SOCKET_THREADS = re.compile(r"NET/Socket ?: Using \d+ threads")
SOCKET_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<ifname>[^\s:]+):(?P<addr>\S+?)<(?P<port>\d+)>")
USING_NET = re.compile(r"^\s*Using network (?P<net>.+?)\s*$")  # applied to the message after "NCCL INFO"
BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?P<ifname>[^\s:]+):(?P<addr>\S+)<(?P<port>\d+)>")
NET_CHANNEL = re.compile(
    r"Channel (?P<ch>\d+)/(?P<conn>\d+) : (?P<src>\d+)\[(?P<srcdev>[0-9a-f]+)\] -> (?P<dst>\d+)"
    r"\[(?P<dstdev>[0-9a-f]+)\] \[(?P<dir>send|receive)\] via NET/(?P<net>[^/]+)/(?P<netdev>\d+)"
    r"(?:\((?P<proxy>\d+)\))?(?P<gdr>/GDRDMA)?(?P<pci>\(PCI\))?(?P<shared>/Shared)?\s*$"
)
# Any connection line, intra- or inter-node: its transport is everything after "via" (P2P/CUMEM/read,
# P2P/direct pointer/read, SHM/direct/direct, NET/IB/1/GDRDMA, ...). Ring-order lines ("Ring 00 : 0 -> 1
# -> 0", "Channel 00/24 :  0 1") carry no "rank[dev]" brackets and never match.
TRANSPORT_CHANNEL = re.compile(
    r"(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-fx]+)\] -> "
    r"(?P<dst>\d+)\[(?P<dstdev>[0-9a-fx]+)\](?: \[(?P<dir>send|receive)\])? "
    r"via (?P<via>\S+(?: pointer(?:/\S+)?)?)"
)
COMM_SPAN = re.compile(
    r"comm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<local>\d+)"
)
RING_ORDER = re.compile(r"^\s*Channel (?P<ch>\d+)/(?P<n>\d+) :(?P<ranks>(?:\s+\d+)+)\s*$")
CHANNEL_COUNTS = re.compile(
    r"(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?:(?P<nvls>\d+) nvls channels, )?"
    r"(?P<p2p>\d+) p2p channels, (?P<per_peer>\d+) p2p channels per peer"
)
NVLS_SUPPORT = re.compile(r"NVLS multicast support is (?P<not>not )?available")
INTRA_FAMILIES = ("P2P", "SHM", "NVLS")
MAX_INTRA_LINES = 50
MAX_NET_CHANNEL_LINES = 5

# Lines worth keeping as evidence even though they do not decide the verdict.
_EVIDENCE = re.compile(
    r"NCCL version|NCCL_IB_HCA|NCCL_SOCKET_IFNAME|NCCL_NET|NET/|Using network|Bootstrap ?:"
)

# Fatal engine start-up lines (SGLang/vLLM/torch): once one appears the NCCL lines will never come, so a
# pending verdict fails at once instead of waiting for the timeout. Never used to fail a decided log.
ENGINE_FATAL = re.compile(
    r"CUDA out of memory|OutOfMemoryError|RuntimeError: Not enough memory|"
    r"Received sigquit from a child process|Scheduler hit an exception|"
    r"Engine core initialization failed|EngineCore failed to start"
)
MAX_FATAL_LINES = 5
_FATAL_HINTS = ("memory", "Memory", "sigquit", "exception", "Engine")  # cheap filter before the regex

HCA_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # used with fullmatch

MAX_EVIDENCE_LINES = 200  # lines that decide the verdict (NET/IB, NET/Socket, Using network, WARN)
MAX_CONTEXT_LINES = 50  # other network lines kept for context (version, env, plugin, first channels)
MAX_LINE_CHARS = 500

RULE = (
    "NCCL must use NET/IB on every expected HCA (and nothing else, at least min_hcas of them) "
    "with 'Using network IB'"
)


class HcaSpecError(ValueError):
    """An expected-HCA entry that cannot be an HCA name (message names the value and the rule)."""


def parse_hca_specs(values: list[str] | str | None) -> list[dict]:
    """Normalise expected HCAs: ``[mlx5_0, mlx5_3:1]`` or an NCCL_IB_HCA string ``=mlx5_0:1,mlx5_3:1``.

    Returns ``[{"name": "mlx5_0", "port": None | int}, ...]`` (port None = any port). A leading ``=``
    (exact match) is accepted because it is how inventories write NCCL_IB_HCA; a ``^`` exclusion list
    is refused: it says what must NOT be used, which cannot prove the expected rails are in use.
    """
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    specs: list[dict] = []
    seen: set[tuple[str, int | None]] = set()
    for item in items:
        text = str(item).strip()
        if text.startswith("^"):
            raise HcaSpecError(
                f"expected_hcas entry {text!r} is an exclusion list ('^'); "
                "rule: list the HCAs that must be used"
            )
        text = text.lstrip("=")
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            parts = entry.split(":")
            name = parts[0]
            port: int | None = None
            if not HCA_NAME.fullmatch(name) or len(parts) > 4:
                raise HcaSpecError(
                    f"expected_hcas entry {entry!r} is not an HCA like mlx5_0 or mlx5_0:1 "
                    "(rule: name[:port], letters/digits/_.-)"
                )
            if len(parts) >= 2 and parts[1] != "":
                if not parts[1].isdigit():
                    raise HcaSpecError(
                        f"expected_hcas entry {entry!r} has port {parts[1]!r}; rule: the port is an integer"
                    )
                port = int(parts[1])
            key = (name, port)
            if key not in seen:
                seen.add(key)
                specs.append({"name": name, "port": port})
    return specs


def format_hca(spec: dict) -> str:
    """``{"name": "mlx5_0", "port": 1}`` -> ``mlx5_0:1`` (port omitted when None)."""
    return spec["name"] if spec.get("port") is None else f"{spec['name']}:{spec['port']}"


def _matches(spec: dict, dev: dict) -> bool:
    return spec["name"] == dev["name"] and (spec["port"] is None or spec["port"] == dev["port"])


def parse_line(line: str) -> dict | None:
    """Split one NCCL log line into prefix fields and message; None for a non-NCCL line."""
    m = NCCL_PREFIX.search(line.rstrip("\r\n"))
    if not m:
        return None
    return {
        "host": m.group("host"),
        "pid": int(m.group("pid")),
        "level": m.group("lvl"),
        "msg": m.group("msg"),
        "proc": f"{m.group('host')}:{m.group('pid')}",
    }


def parse_ib_devices(devs: str) -> list[dict]:
    """Device tokens of a ``NET/IB : Using`` line -> ``[{"idx", "name", "port", "link"}]``."""
    return [
        {
            "idx": int(d.group("idx")),
            "name": d.group("dev"),
            "port": int(d.group("port")),
            "link": d.group("ll"),
        }
        for d in NET_IB_DEV.finditer(devs)
    ]


class NcclLogFacts:
    """Accumulates what one log says about NCCL's network, line by line (no I/O, no verdict)."""

    def __init__(self) -> None:
        self.nccl_lines = 0
        self.versions: list[str] = []
        self.ib_lines: list[dict] = []  # {proc, devices, oob_if, oob_addr, line}
        self.ib_none: list[str] = []  # raw lines
        self.socket_lines: list[str] = []
        self.nets: dict[str, str] = {}  # proc -> last "Using network" name
        self.net_lines: list[tuple[str, str]] = []  # (net name, raw line)
        self.channel_nets: set[str] = set()
        self.gdr = False
        self.bootstrap_ifs: list[str] = []
        self.warnings: list[str] = []
        self.evidence: list[str] = []
        self.evidence_dropped = 0
        self.engine_errors: list[str] = []
        self._seen_evidence: set[str] = set()
        self._kept = {True: 0, False: 0}
        # Intra-node facts: every connection's transport, the communicators' span, ring set-up.
        self.channel_transports: dict[str, int] = {}
        self.channel_procs: set[str] = set()
        self.net_channel_lines: list[str] = []
        self.comm_nnodes: set[int] = set()
        self.rings_connected: set[str] = set()
        self.trees_connected: set[str] = set()
        self.channel_counts: dict[str, int] = {}
        self.nvls: str | None = None
        self.nvls_connected = False
        self.intra_lines: list[str] = []

    def _keep(self, line: str, decisive: bool) -> None:
        """Keep a line as evidence; deciding lines have their own budget so context cannot crowd them out."""
        text = line.rstrip("\r\n")[:MAX_LINE_CHARS]
        if text in self._seen_evidence:
            return
        if self._kept[decisive] >= (MAX_EVIDENCE_LINES if decisive else MAX_CONTEXT_LINES):
            self.evidence_dropped += 1
            return
        self._kept[decisive] += 1
        self._seen_evidence.add(text)
        self.evidence.append(text)

    def feed(self, line: str) -> None:
        """Take one raw log line (with or without its newline)."""
        rec = parse_line(line) if "NCCL " in line else None  # substring test first: logs are mostly not NCCL
        if rec is None:
            if (
                len(self.engine_errors) < MAX_FATAL_LINES
                and any(h in line for h in _FATAL_HINTS)
                and ENGINE_FATAL.search(line)
            ):
                self.engine_errors.append(line.rstrip("\r\n")[:MAX_LINE_CHARS])
            return
        self.nccl_lines += 1
        msg = rec["msg"]
        keep = False
        if rec["level"] == "WARN" and ("NET/" in msg or "IB" in msg or "Socket" in msg):
            self.warnings.append(line.rstrip("\r\n")[:MAX_LINE_CHARS])
            keep = True
        m = NCCL_VERSION.search(msg)
        if m and m.group("ver") not in self.versions:
            self.versions.append(m.group("ver"))
        if NET_IB_NONE.search(msg):
            self.ib_none.append(line.rstrip("\r\n")[:MAX_LINE_CHARS])
            keep = True
        m = NET_IB_USING.search(msg)
        if m:
            self.ib_lines.append(
                {
                    "proc": rec["proc"],
                    "devices": parse_ib_devices(m.group("devs")),
                    "oob_if": m.group("oobif"),
                    "oob_addr": m.group("oobaddr"),
                    "line": line.rstrip("\r\n")[:MAX_LINE_CHARS],
                }
            )
            keep = True
        if NET_SOCKET.search(msg) or NET_SOCKET_THREADS.search(msg):
            self.socket_lines.append(line.rstrip("\r\n")[:MAX_LINE_CHARS])
            keep = True
        m = USING_NET.search(msg)
        if m:
            self.nets[rec["proc"]] = m.group("net")
            self.net_lines.append((m.group("net"), line.rstrip("\r\n")[:MAX_LINE_CHARS]))
            keep = True
        m = BOOTSTRAP.search(msg)
        if m and m.group("ifname") not in self.bootstrap_ifs:
            self.bootstrap_ifs.append(m.group("ifname"))
        m = NET_CHANNEL.search(msg)
        if m:
            self.channel_nets.add(m.group("net"))
            if m.group("gdr"):
                self.gdr = True
        self._feed_intra(rec["proc"], msg, line)
        if keep or _EVIDENCE.search(msg):
            self._keep(line, decisive=keep)

    def _feed_intra(self, proc: str, msg: str, line: str) -> None:
        """Connections, communicator span, ring/tree set-up, channel counts, NVLS (substring tests first)."""
        text = line.rstrip("\r\n")[:MAX_LINE_CHARS]
        intra = False
        if " via " in msg:
            m = TRANSPORT_CHANNEL.search(msg)
            if m:
                key = transport_key(m.group("via"))
                self.channel_transports[key] = self.channel_transports.get(key, 0) + 1
                self.channel_procs.add(proc)
                if key.startswith("NET/"):
                    if len(self.net_channel_lines) < MAX_NET_CHANNEL_LINES:
                        self.net_channel_lines.append(text)
                elif self.channel_transports[key] <= 2:  # two examples of each transport
                    intra = True
        elif "Connected all rings" in msg:
            self.rings_connected.add(proc)
            intra = len(self.rings_connected) <= 8
        elif "Connected all trees" in msg:
            self.trees_connected.add(proc)
        elif "nNodes" in msg:
            m = COMM_SPAN.search(msg)
            if m:
                self.comm_nnodes.add(int(m.group("nnodes")))
                intra = True
        elif "channels" in msg:
            m = CHANNEL_COUNTS.search(msg)
            if m:
                for name, value in m.groupdict().items():
                    if value is not None:
                        self.channel_counts[name] = max(self.channel_counts.get(name, 0), int(value))
                intra = True
        elif "NVLS" in msg:
            m = NVLS_SUPPORT.search(msg)
            if m:
                # one GPU without multicast makes the communicator's NVLS unavailable
                self.nvls = (
                    "not available" if (m.group("not") or self.nvls == "not available") else "available"
                )
                intra = True
            elif "Connected NVLS" in msg:
                self.nvls_connected = True
                intra = True
        elif "Channel" in msg:
            m = RING_ORDER.match(msg)
            if m:
                n = int(m.group("n"))
                self.channel_counts["ring"] = max(self.channel_counts.get("ring", 0), n)
                intra = int(m.group("ch")) == 0
        if intra and len(self.intra_lines) < MAX_INTRA_LINES:
            self.intra_lines.append(text)

    def feed_text(self, text: str) -> None:
        """Feed a whole log text (tests and one-shot reads)."""
        for line in text.splitlines():
            self.feed(line)

    # --- summaries ---------------------------------------------------------------------------------

    def hcas_used(self) -> list[str]:
        """Union of ``name:port`` over every NET/IB Using line, in first-seen order."""
        out: list[str] = []
        for ib in self.ib_lines:
            for d in ib["devices"]:
                key = f"{d['name']}:{d['port']}"
                if key not in out:
                    out.append(key)
        return out

    def oob_ifs(self) -> list[str]:
        out: list[str] = []
        for ib in self.ib_lines:
            if ib["oob_if"] not in out:
                out.append(ib["oob_if"])
        return out

    def socket_evidence(self) -> list[str]:
        """Every sign of a socket fallback: NET/Socket lines, 'Using network Socket', NET/Socket channels."""
        out = list(self.socket_lines)
        out += [ln for net, ln in self.net_lines if net == "Socket"]
        if "Socket" in self.channel_nets:
            out.append("channel lines go 'via NET/Socket'")
        return out

    def connected_procs(self) -> set[str]:
        """Processes that set up connections (a connection line or "Connected all rings")."""
        return self.channel_procs | self.rings_connected

    def families(self) -> dict[str, int]:
        """Connection counts per transport family: P2P, SHM, NVLS, NET."""
        out: dict[str, int] = {}
        for key, n in self.channel_transports.items():
            fam = key.split("/")[0]
            out[fam] = out.get(fam, 0) + n
        return out

    def data_path(self) -> str:
        """intra-node | network | unknown: where NCCL's connections go (not which plugin it loaded)."""
        fams = self.families()
        if not fams:
            return "unknown"
        return "network" if "NET" in fams else "intra-node"

    def transport(self) -> str:
        """ib | socket | none — socket wins over ib because a partial fallback is still a fallback."""
        if self.socket_evidence():
            return "socket"
        if any(ib["devices"] for ib in self.ib_lines) or any(n.startswith("IB") for n in self.nets.values()):
            return "ib"
        return "none"


def transport_key(via: str) -> str:
    """``NET/IB/3/GDRDMA`` -> ``NET/IB`` (device index and flags vary per line); intra-node kept whole."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "NET/" + parts[1]
    return via


def describe_transports(counts: dict[str, int]) -> str:
    """``P2P/CUMEM/read x48, SHM/direct/direct x8`` (most used first)."""
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _judge_intra(facts: NcclLogFacts, min_processes: int, allowed: tuple[str, ...]) -> tuple[list, list]:
    """require="intra": connections set up, none over the network, every communicator on one node."""
    problems: list[str] = []
    pending: list[str] = []
    for line in facts.net_channel_lines:
        problems.append(f"a connection goes over the network where intra-node was required: {line.strip()}")
    for n in sorted(facts.comm_nnodes):
        if n > 1:
            problems.append(f"a communicator spans {n} nodes ('nNodes {n}') where intra-node was required")
    for fam, count in sorted(facts.families().items()):
        if fam != "NET" and fam not in allowed:
            keys = [k for k in facts.channel_transports if k.split("/")[0] == fam]
            problems.append(
                f"{count} connection(s) via {', '.join(keys)}, not an allowed intra-node transport "
                f"({', '.join(allowed)})"
            )
    if facts.nccl_lines == 0:
        pending.append("no NCCL line (is NCCL_DEBUG=INFO set for the server?)")
    elif not facts.channel_transports:
        pending.append("no connection line ('Channel NN/M : a[x] -> b[y] via P2P/...')")
    elif len(facts.connected_procs()) < max(1, min_processes):
        pending.append(
            f"{len(facts.connected_procs())} process(es) set up connections, need {max(1, min_processes)}"
        )
    return problems, pending


def judge(
    facts: NcclLogFacts,
    expected: list[dict],
    require: str = "ib",
    min_processes: int = 1,
    intra_transports: tuple[str, ...] = INTRA_FAMILIES,
    min_hcas: int = 0,
) -> dict:
    """Decide one log: ``{"state": "pass"|"fail"|"pending", "problems": [...], "pending": [...]}``.

    "fail" means a fail-closed line was seen (no more lines can rescue it); "pending" lists what is
    still missing (the caller keeps polling until its timeout, then treats pending as failure).
    """
    problems: list[str] = []
    pending: list[str] = []
    if require == "ib":
        for line in facts.ib_none:
            problems.append(f"'NET/IB : No device found.' (no usable HCA): {line.strip()}")
        for ev in facts.socket_evidence():
            problems.append(f"socket fallback: {ev.strip()}")
        names = [format_hca(s) for s in expected]
        for ib in facts.ib_lines:
            devs = ib["devices"]
            if not devs:
                problems.append(f"NET/IB line lists no devices: {ib['line'].strip()}")
                continue
            for d in devs:
                if expected and not any(_matches(s, d) for s in expected):
                    problems.append(
                        f"NET/IB uses {d['name']}:{d['port']} which is not an expected HCA "
                        f"(expected {', '.join(names)}) in: {ib['line'].strip()}"
                    )
            for s in expected:
                if not any(_matches(s, d) for d in devs):
                    problems.append(
                        f"expected HCA {format_hca(s)} missing from NET/IB line: {ib['line'].strip()}"
                    )
            used = sorted({f"{d['name']}:{d['port']}" for d in devs})
            if len(used) < min_hcas:
                problems.append(
                    f"NET/IB uses {len(used)} HCA(s) ({', '.join(used)}), fewer than min_hcas={min_hcas} "
                    f"(every rail must carry traffic): {ib['line'].strip()}"
                )
        for proc, net in facts.nets.items():
            if net != "Socket" and not net.startswith("IB"):  # Socket is already reported as a fallback
                problems.append(f"process {proc} reports 'Using network {net}' (not IB)")
        if facts.nccl_lines == 0:
            pending.append("no NCCL line (is NCCL_DEBUG=INFO set for the server?)")
        elif not facts.ib_lines and not problems:
            pending.append("no 'NET/IB : Using' line")
        ib_procs = [p for p, n in facts.nets.items() if n.startswith("IB")]
        if not problems and len(ib_procs) < max(1, min_processes):
            pending.append(
                f"{len(ib_procs)} process(es) report 'Using network IB', need {max(1, min_processes)}"
                if ib_procs
                else "no 'Using network IB' line"
            )
        if not problems and facts.channel_transports and facts.data_path() == "intra-node":
            # NCCL loads its IB plugin on one node too: only a connection via NET/ proves inter-node IB.
            span = (
                f"; every communicator reports nNodes {max(facts.comm_nnodes)}" if facts.comm_nnodes else ""
            )
            pending.append(
                "no connection goes over the network: every one is intra-node "
                f"({describe_transports(facts.channel_transports)}){span}"
            )
    elif require == "intra":
        problems, pending = _judge_intra(facts, min_processes, tuple(intra_transports))
    else:
        want = {"socket": "Socket", "any": None}[require]
        for proc, net in facts.nets.items():
            if want is not None and net != want:
                problems.append(f"process {proc} reports 'Using network {net}', required {want}")
        if facts.nccl_lines == 0:
            pending.append("no NCCL line (is NCCL_DEBUG=INFO set for the server?)")
        elif len(facts.nets) < max(1, min_processes):
            pending.append(
                f"{len(facts.nets)} process(es) report 'Using network', need {max(1, min_processes)}"
            )
    if pending and not problems and facts.engine_errors:
        problems.append(f"server failed before NCCL reported its transport: {facts.engine_errors[0].strip()}")
    state = "fail" if problems else ("pending" if pending else "pass")
    return {"state": state, "problems": problems, "pending": pending}


def summarize(facts: NcclLogFacts) -> dict:
    """What a log showed, for the module result and the saved verdict (JSON-ready)."""
    oob = facts.oob_ifs()
    return {
        "transport": facts.transport(),
        "net": sorted(set(facts.nets.values())),
        "hcas": facts.hcas_used(),
        "oob_if": oob[0] if oob else None,
        "oob_ifs": oob,
        "bootstrap_ifs": list(facts.bootstrap_ifs),
        "gdr": facts.gdr,
        "nccl_version": facts.versions[0] if facts.versions else None,
        "nccl_lines": facts.nccl_lines,
        "processes": len(facts.nets),
        "lines": list(facts.evidence),
        "lines_dropped": facts.evidence_dropped,
        "warnings": list(facts.warnings),
        "engine_errors": list(facts.engine_errors),
        "data_path": facts.data_path(),
        "channel_transports": dict(facts.channel_transports),
        "connected_processes": len(facts.connected_procs()),
        "rings_connected": len(facts.rings_connected),
        "trees_connected": len(facts.trees_connected),
        "nnodes_seen": sorted(facts.comm_nnodes),
        "channel_counts": dict(facts.channel_counts),
        "nvls": facts.nvls,
        "nvls_connected": facts.nvls_connected,
        "intra_lines": list(facts.intra_lines),
    }
