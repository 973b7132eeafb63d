#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: prove from server logs that NCCL runs over InfiniBand on the expected HCAs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_transport
short_description: Fail-closed gate on the network transport NCCL chose, read from server logs
description:
  - >-
    Reads one or more server logs written with C(NCCL_DEBUG=INFO) and reports, per log, the transport
    NCCL chose (C(ib), C(socket) or C(none)), the HCAs listed on its C(NET/IB : Using) lines, the
    out-of-band interface and the NCCL lines it based that on.
  - >-
    Passes only when every log shows C(NET/IB : Using) with exactly the expected HCAs (every expected
    one present, no other device) and C(Using network IB) (plugin names such as C(IBext_v8) count as IB).
  - >-
    Fails closed on C(NET/IB : No device found.), on a socket fallback (C(NET/Socket : Using ...),
    C(Using network Socket), channels C(via NET/Socket)), on a C(NET/IB) line listing no device or a
    device that is not expected, on a missing expected HCA, and when the deciding lines do not appear
    within O(timeout) seconds (the files are polled, so the module can run while the server starts).
  - >-
    While waiting, a fatal engine start-up line (CUDA out of memory, C(Received sigquit from a child
    process), vLLM C(Engine core initialization failed)) ends the wait at once with a failure: the NCCL
    lines will never come. It never fails a log whose NCCL lines already decided it.
  - With O(nnodes=1) there is no inter-node transport; the module passes at once and still reports what
    the logs show (except with O(require=intra), which judges the single node).
  - >-
    NCCL loads its network plugin on a single node too (C(NET/IB : Using), C(Using network IB)), so with
    O(require=ib) a log whose connection lines (C(Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read),
    C(via SHM/direct/direct)) are all intra-node is not proof of IB: it stays pending and fails at the
    timeout, saying every connection is intra-node. A log without connection lines is judged as before.
  - >-
    O(require=intra) is the gate for one node with several GPUs (a single-node TP run): every log must show
    connection lines from at least O(min_processes) processes, none of them C(via NET/) (traffic leaving
    the node), no communicator with C(nNodes) above 1, and only transports listed in O(intra_transports).
  - Read-only; runs the same in check mode, except that O(dest) is not written (RV(would_write) says
    where it would go).
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  logs:
    description:
      - Server log files to read, typically one per node (head and worker). Every log must pass.
      - Mutually exclusive with O(log).
    type: list
    elements: path
  log:
    description: A single server log (shorthand for a one-element O(logs)).
    type: path
  expected_hcas:
    description:
      - HCAs NCCL must use, for example V([mlx5_0, mlx5_3]). An entry may carry a port, V(mlx5_0:1),
        which must then match the port NCCL logs. An NCCL_IB_HCA string such as V(=mlx5_0:1,mlx5_3:1)
        is accepted too (the leading C(=) is dropped); a C(^) exclusion list is refused.
      - An empty list accepts any non-empty device list (not recommended for a real cluster).
    type: list
    elements: str
    default: []
  nnodes:
    description: Number of nodes the server spans. V(1) passes trivially ("single node").
    type: int
    required: true
  timeout:
    description:
      - Seconds to wait for the deciding NCCL lines to appear, re-reading the files every
        O(poll_interval) seconds. A fail-closed line ends the wait at once. V(0) reads once.
    type: float
    default: 60
  poll_interval:
    description: Seconds between two reads of the logs while waiting.
    type: float
    default: 0.5
  min_hcas:
    description:
      - >-
        With O(require=ib), every C(NET/IB : Using) line must list at least this many distinct HCAs
        (both rails: 2). Real NCCL given C(NCCL_IB_HCA=mlx5_0:1,mlx5_3:1) with mlx5_3 missing uses
        mlx5_0 alone; this rule (and O(expected_hcas)) fails that. 0 = no count rule.
    type: int
    default: 0
  min_processes:
    description:
      - Number of distinct NCCL processes (C(host:pid)) per log that must report C(Using network IB)
        before the log passes. Set it to the GPUs per node to wait for every local rank.
    type: int
    default: 1
  require:
    description:
      - Transport required. V(ib) is the real-cluster gate. V(socket) requires C(Using network Socket)
        (a deliberate TCP-only setup); V(any) only requires that NCCL reported a network. V(intra) is the
        single-node gate (needs O(nnodes=1)), connections within the node only.
    type: str
    choices: [ib, socket, any, intra]
    default: ib
  intra_transports:
    description:
      - With O(require=intra), the transport families a connection may use. V(P2P) (NVLink or PCIe
        peer-to-peer, C(P2P/CUMEM), C(P2P/IPC), C(P2P/direct pointer)), V(SHM) (through host memory) and
        V(NVLS). Set V([P2P]) on an NVLink node to fail a silent fallback to host memory.
    type: list
    elements: str
    default: [P2P, SHM, NVLS]
  dest:
    description:
      - Write the verdict (the result below plus host and time) as JSON to this path, atomically,
        whether the gate passes or fails. Not written in check mode.
    type: path
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - The parser lives in C(module_utils/nccl_log.py) (NCCL 2.18 to HEAD line formats).
  - The result always has C(changed=false); the module only reads the logs (and writes O(dest)).
"""

EXAMPLES = r"""
- name: Nccl_gate | prove NCCL uses both IB rails on both nodes
  nccl_transport:
    logs:
      - "{{ run_dir }}/server/head.log"
      - "{{ run_dir }}/server/worker.log"
    expected_hcas: [mlx5_0:1, mlx5_3:1]
    nnodes: 2
    timeout: 120
    min_processes: 8
    dest: "{{ run_dir }}/server/{{ inventory_hostname }}_nccl_gate.json"
  register: nccl_gate_result

- name: Nccl_gate | a single-node TP8 run keeps its traffic on NVLink (P2P only)
  nccl_transport:
    log: "{{ run_dir }}/server/{{ inventory_hostname }}.log"
    nnodes: 1
    require: intra
    intra_transports: [P2P]
    min_processes: 8

- name: Nccl_gate | single-node run (passes, still records what NCCL said)
  nccl_transport:
    log: "{{ run_dir }}/server/{{ inventory_hostname }}.log"
    nnodes: 1
"""

RETURN = r"""
passed:
  description: True when every log passed (always true for nnodes=1).
  returned: always
  type: bool
  sample: true
msg:
  description: One-line verdict; on failure names each failing log and the rule it broke.
  returned: always
  type: str
  sample: "NCCL over IB on mlx5_0:1, mlx5_3:1 in 2 log(s)"
logs:
  description: One entry per log, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    path: {description: The log file., type: str}
    exists: {description: Whether the file existed at the last read., type: bool}
    passed: {description: This log's verdict., type: bool}
    state: {description: "pass, fail, or pending (deciding lines still missing at the timeout).", type: str}
    problems: {description: Fail-closed findings and missing lines for this log., type: list, elements: str}
    transport: {description: "ib, socket or none.", type: str, sample: ib}
    net: {description: "Distinct names from 'Using network X'.", type: list, elements: str, sample: [IB]}
    hcas:
      description: "Devices on the NET/IB lines as name:port."
      type: list
      elements: str
      sample: ["mlx5_0:1"]
    oob_if: {description: Out-of-band interface of the first NET/IB line., type: str, sample: eth0}
    oob_ifs: {description: Every OOB interface seen., type: list, elements: str}
    bootstrap_ifs: {description: Interfaces on Bootstrap lines., type: list, elements: str}
    gdr: {description: Whether channel lines show GPUDirect RDMA (/GDRDMA)., type: bool}
    nccl_version: {description: First NCCL version seen., type: str, sample: 2.21.5}
    nccl_lines: {description: Number of NCCL lines read., type: int}
    processes: {description: "Distinct host:pid that printed 'Using network'.", type: int}
    lines:
      description: >-
        The NCCL network lines the verdict is based on, deduplicated - deciding lines (at most 200)
        and context lines such as version, env and channels (at most 50).
      type: list
      elements: str
    lines_dropped: {description: Evidence lines beyond the cap., type: int}
    warnings: {description: NCCL WARN lines about the network., type: list, elements: str}
    data_path:
      description: "intra-node, network (a connection via NET/) or unknown (no connection line)."
      type: str
    channel_transports:
      description: 'Connection lines per transport, for example C({"P2P/CUMEM/read": 48, "NET/IB": 16}).'
      type: dict
    connected_processes:
      description: Processes that set up connections or printed Connected all rings.
      type: int
    rings_connected: {description: "Processes that printed 'Connected all rings'.", type: int}
    trees_connected: {description: "Processes that printed 'Connected all trees'.", type: int}
    nnodes_seen: {description: "Distinct nNodes values of the communicators.", type: list, elements: int}
    channel_counts:
      description: Channel counts (ring, coll, collnet, nvls, p2p, per_peer), the largest seen.
      type: dict
    nvls: {description: "NVLS multicast: available, not available, or null when not reported.", type: str}
    nvls_connected: {description: "Whether 'Connected NVLS' was seen.", type: bool}
    intra_lines:
      description: Intra-node evidence (communicator span, ring set-up, two lines per transport), at most 50.
      type: list
      elements: str
    engine_errors: {description: Fatal engine start-up lines seen (at most 5)., type: list, elements: str}
expected_hcas:
  description: The expected HCAs after normalisation.
  returned: always
  type: list
  elements: str
  sample: ["mlx5_0:1", "mlx5_3:1"]
waited_s:
  description: Seconds spent polling.
  returned: always
  type: float
dest_written:
  description: Whether O(dest) was written.
  returned: when O(dest) is set
  type: bool
would_write:
  description: The O(dest) path that check mode did not write.
  returned: when O(dest) is set in check mode
  type: str
"""

import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_json  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.nccl_log import (  # noqa: E402
    INTRA_FAMILIES,
    RULE,
    HcaSpecError,
    NcclLogFacts,
    describe_transports,
    format_hca,
    judge,
    parse_hca_specs,
    summarize,
)

argument_spec = dict(
    logs=dict(type="list", elements="path"),
    log=dict(type="path"),
    expected_hcas=dict(type="list", elements="str", default=[]),
    nnodes=dict(type="int", required=True),
    timeout=dict(type="float", default=60.0),
    poll_interval=dict(type="float", default=0.5),
    min_processes=dict(type="int", default=1),
    min_hcas=dict(type="int", default=0),
    require=dict(type="str", choices=["ib", "socket", "any", "intra"], default="ib"),
    intra_transports=dict(type="list", elements="str", default=["P2P", "SHM", "NVLS"]),
    dest=dict(type="path"),
)

READ_CHUNK = 1 << 20


class LogTail:
    """Incremental reader: feeds only new complete lines to the facts, survives truncation."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.exists = False
        self.offset = 0
        self.partial = b""
        self.facts = NcclLogFacts()

    def poll(self, final: bool = False) -> None:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            self.exists = False
            return
        self.exists = True
        if size < self.offset:  # rotated or truncated: start over
            self.offset, self.partial, self.facts = 0, b"", NcclLogFacts()
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                while True:
                    chunk = handle.read(READ_CHUNK)
                    if not chunk:
                        break
                    self.offset += len(chunk)
                    data = self.partial + chunk
                    lines = data.split(b"\n")
                    self.partial = lines.pop()
                    for raw in lines:
                        self.facts.feed(raw.decode("utf-8", errors="replace"))
        except OSError:
            self.exists = os.path.exists(self.path)
            return
        if final and self.partial:
            self.facts.feed(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""


def _one_line(problems: list[str], limit: int = 2) -> str:
    shown = "; ".join(problems[:limit])
    return shown + (f" (+{len(problems) - limit} more)" if len(problems) > limit else "")


def run(module: AnsibleModule) -> dict:
    """Poll the logs until each is decided or the timeout passes; return the result dict."""
    p = module.params
    if p["logs"] and p["log"]:
        module.fail_json(msg="nccl_transport: give either 'logs' or 'log', not both")
    paths = list(p["logs"] or ([p["log"]] if p["log"] else []))
    if not paths:
        module.fail_json(
            msg="nccl_transport: no log given (rule: set 'logs' to a list of paths or 'log' to one)"
        )
    if p["nnodes"] < 1:
        module.fail_json(msg=f"nccl_transport: nnodes={p['nnodes']} (rule: nnodes >= 1)")
    if p["timeout"] < 0:
        module.fail_json(msg=f"nccl_transport: timeout={p['timeout']} (rule: timeout >= 0 seconds)")
    if p["poll_interval"] <= 0:
        module.fail_json(msg=f"nccl_transport: poll_interval={p['poll_interval']} (rule: > 0 seconds)")
    if p["min_processes"] < 1:
        module.fail_json(msg=f"nccl_transport: min_processes={p['min_processes']} (rule: >= 1)")
    if p["min_hcas"] < 0:
        module.fail_json(msg=f"nccl_transport: min_hcas={p['min_hcas']} (rule: >= 0)")
    try:
        expected = parse_hca_specs(p["expected_hcas"])
    except HcaSpecError as exc:
        module.fail_json(msg=f"nccl_transport: {exc}")
    intra = tuple(p["intra_transports"])
    if p["require"] == "intra":
        if p["nnodes"] != 1:
            module.fail_json(
                msg=f"nccl_transport: require=intra with nnodes={p['nnodes']} (rule: the intra-node gate "
                "judges one node; use require=ib for a multi-node server)"
            )
        unknown = [t for t in intra if t not in INTRA_FAMILIES]
        if unknown or not intra:
            module.fail_json(
                msg=f"nccl_transport: intra_transports={list(intra)} (rule: a non-empty list of "
                f"{', '.join(INTRA_FAMILIES)})"
            )

    tails = [LogTail(path) for path in paths]
    started = time.monotonic()
    single = p["nnodes"] == 1 and p["require"] != "intra"
    deadline = started + (0.0 if single else p["timeout"])
    verdicts: list[dict] = []
    while True:
        final = time.monotonic() >= deadline
        for tail in tails:
            tail.poll(final=final)
        verdicts = [
            judge(t.facts, expected, p["require"], p["min_processes"], intra, p["min_hcas"]) for t in tails
        ]
        if final or all(v["state"] != "pending" for v in verdicts):
            if not final:
                for tail in tails:  # decided: include a trailing line without newline in the evidence
                    tail.poll(final=True)
                verdicts = [
                    judge(t.facts, expected, p["require"], p["min_processes"], intra, p["min_hcas"])
                    for t in tails
                ]
            break
        time.sleep(max(0.0, min(p["poll_interval"], deadline - time.monotonic())))
    waited = round(time.monotonic() - started, 3)

    logs = []
    for index, tail in enumerate(tails):  # (no zip(strict=): nodes may run Python < 3.10)
        verdict = verdicts[index]
        entry = {"path": tail.path, "exists": tail.exists}
        entry.update(summarize(tail.facts))
        problems = list(verdict["problems"])
        if verdict["state"] == "pending":
            what = "file does not exist" if not tail.exists else "; ".join(verdict["pending"])
            problems.append(f"{what} after {p['timeout']:g}s (timeout)")
        entry["state"] = "pass" if single else verdict["state"]
        entry["passed"] = single or verdict["state"] == "pass"
        entry["problems"] = problems
        logs.append(entry)

    names = [format_hca(s) for s in expected]
    if single:
        passed = True
        seen = ", ".join(f"{e['path']}: {e['transport']}" for e in logs)
        msg = f"single node: no inter-node transport (seen {seen})"
    else:
        passed = all(e["passed"] for e in logs)
        if passed and p["require"] == "intra":
            seen: dict = {}
            for e in logs:
                for k, n in e["channel_transports"].items():
                    seen[k] = seen.get(k, 0) + n
            procs = sum(e["connected_processes"] for e in logs)
            msg = f"NCCL intra-node in {len(logs)} log(s): {describe_transports(seen)} ({procs} process(es))"
        elif passed:
            hcas = ", ".join(names) if names else ", ".join(sorted({h for e in logs for h in e["hcas"]}))
            net = {"ib": "IB", "socket": "Socket", "any": "a network"}[p["require"]]
            msg = f"NCCL over {net}" + (f" on {hcas}" if hcas and p["require"] == "ib" else "")
            msg += f" in {len(logs)} log(s)"
        else:
            bad = "; ".join(f"{e['path']}: {_one_line(e['problems'])}" for e in logs if not e["passed"])
            if p["require"] == "ib":
                rule = RULE
            elif p["require"] == "intra":
                rule = (
                    f"every connection inside the node ({', '.join(intra)}), none over the network, "
                    f"from at least {p['min_processes']} process(es)"
                )
            else:
                rule = f"NCCL must report 'Using network' ({p['require']})"
            msg = f"NCCL gate failed closed (rule: {rule}): {bad}"
    return {
        "changed": False,
        "passed": passed,
        "msg": msg,
        "nnodes": p["nnodes"],
        "require": p["require"],
        "expected_hcas": names,
        "waited_s": waited,
        "logs": logs,
    }


def write_dest(module: AnsibleModule, result: dict) -> None:
    """Save the verdict atomically (or say where it would go in check mode)."""
    dest = module.params["dest"]
    if not dest:
        return
    if module.check_mode:
        result["dest_written"] = False
        result["would_write"] = dest
        return
    verdict = dict(result)
    verdict.pop("changed", None)
    verdict["schema"] = "quickmap.nccl_gate/1"
    verdict["host"] = platform.node()
    verdict["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        atomic_write_json(dest, verdict)
    except OSError as exc:
        module.fail_json(msg=f"nccl_transport: cannot write dest {dest}: {exc}", **result)
    result["dest_written"] = True


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec,
        mutually_exclusive=[("logs", "log")],
        required_one_of=[("logs", "log")],
        supports_check_mode=True,
    )
    result = run(module)
    write_dest(module, result)
    if not result["passed"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
