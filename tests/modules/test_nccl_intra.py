"""nccl_transport on REAL intra-node NCCL lines: a single-node TP run passes the intra-node gate and fails
the IB gate; inter-node logs fail the intra-node gate. The logs are excerpts quoted in public reports
(fixtures/nccl_intra/README.md names each source).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.module_utils.nccl_log import NcclLogFacts, judge

FIX = Path(__file__).parent / "fixtures" / "nccl_intra"

# (file, processes that set up connections, connection lines per transport)
SINGLE_NODE = [
    ("vllm6201_tp2_p2p_ipc_ib_plugin.log", 2, {"P2P/IPC/read": 16}),
    ("vllm6407_tp4_shm_p2p_ipc.log", 4, {"SHM/direct/direct": 7, "P2P/IPC/read": 4}),
    ("nccl1609_h800_4proc_shm.log", 4, {"SHM/direct/direct": 12}),
    ("nccl1358_2gpu_nnodes1_direct.log", 1, {"P2P/direct pointer": 1}),
    (
        "nccl1027_8gpu_p2p_shm.log",
        1,
        {"P2P/direct pointer": 3, "P2P/direct pointer/read": 3, "SHM/direct/direct": 1},
    ),
    ("tinygrad22_4gpu_direct_pointer.log", 1, {"P2P/direct pointer": 6}),
]
IDS = [s[0].split("_")[0] for s in SINGLE_NODE]


def facts_of(name: str) -> NcclLogFacts:
    facts = NcclLogFacts()
    facts.feed_text((FIX / name).read_text())
    return facts


@pytest.mark.parametrize(("name", "procs", "transports"), SINGLE_NODE, ids=IDS)
def test_single_node_run_passes_the_intra_node_gate(run, name, procs, transports):
    kind, res = run(
        "nccl_transport",
        {"log": str(FIX / name), "nnodes": 1, "require": "intra", "min_processes": procs, "timeout": 0},
    )
    assert kind == "exit", res["msg"]
    log = res["logs"][0]
    assert log["state"] == "pass" and log["data_path"] == "intra-node"
    assert log["channel_transports"] == transports
    assert log["connected_processes"] == procs
    assert res["msg"].startswith("NCCL intra-node in 1 log(s): ")


@pytest.mark.parametrize(("name", "procs", "transports"), SINGLE_NODE, ids=IDS)
def test_the_same_single_node_logs_fail_a_gate_that_requires_net_ib(run, name, procs, transports):
    kind, res = run("nccl_transport", {"log": str(FIX / name), "nnodes": 2, "require": "ib", "timeout": 0})
    assert kind == "fail" and res["passed"] is False
    assert res["logs"][0]["state"] in ("fail", "pending")


def test_ib_plugin_lines_on_one_node_are_not_proof_of_ib(run):
    """vLLM TP2 on one host: NCCL loads its IB plugin ('Using network IB') though every connection is
    P2P. The IB gate used to pass this log; it must fail, saying why."""
    log = str(FIX / "vllm6201_tp2_p2p_ipc_ib_plugin.log")
    kind, res = run("nccl_transport", {"log": log, "nnodes": 2, "require": "ib", "timeout": 0})
    assert kind == "fail"
    entry = res["logs"][0]
    assert entry["transport"] == "ib" and entry["net"] == ["IB"] and entry["processes"] == 2
    assert entry["hcas"] == ["mlx5_7:1", "mlx5_6:1"]
    assert "no connection goes over the network: every one is intra-node (P2P/IPC/read x16)" in res["msg"]
    assert "(timeout)" in res["msg"]


def test_min_processes_waits_for_every_local_rank(run):
    log = str(FIX / "vllm6201_tp2_p2p_ipc_ib_plugin.log")
    kind, res = run(
        "nccl_transport", {"log": log, "nnodes": 1, "require": "intra", "min_processes": 8, "timeout": 0}
    )
    assert kind == "fail" and "2 process(es) set up connections, need 8" in res["msg"]


def test_host_memory_fallback_fails_a_p2p_only_gate(run):
    log = str(FIX / "vllm6407_tp4_shm_p2p_ipc.log")
    kind, res = run(
        "nccl_transport",
        {"log": log, "nnodes": 1, "require": "intra", "intra_transports": ["P2P"], "min_processes": 4},
    )
    assert kind == "fail"
    assert "7 connection(s) via SHM/direct/direct, not an allowed intra-node transport (P2P)" in res["msg"]


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("nccl1814_8node_nvls_ibext.log", "[send] via NET/IBext_v8/4"),
        ("nccl1189_h20_2node_gdrdma.log", "[receive] via NET/IB/3/GDRDMA"),
    ],
)
def test_inter_node_logs_fail_the_intra_node_gate_naming_the_network_line(run, name, needle):
    kind, res = run("nccl_transport", {"log": str(FIX / name), "nnodes": 1, "require": "intra", "timeout": 0})
    assert kind == "fail"
    assert "a connection goes over the network where intra-node was required" in res["msg"]
    assert needle in " ".join(res["logs"][0]["problems"])
    assert res["logs"][0]["data_path"] == "network"


def test_a_communicator_spanning_two_nodes_fails_the_intra_node_gate():
    facts = facts_of("nccl1189_h20_2node_gdrdma.log")
    verdict = judge(facts, [], "intra", 1)
    assert verdict["state"] == "fail"
    assert "a communicator spans 2 nodes ('nNodes 2') where intra-node was required" in verdict["problems"]


def test_quoted_ring_orders_without_connections_stay_pending(run):
    """torchtitan's quote has the communicator and its rings but no connection line yet."""
    log = str(FIX / "torchtitan1570_tp4_nvls_rings.log")
    kind, res = run("nccl_transport", {"log": log, "nnodes": 1, "require": "intra", "timeout": 0})
    assert kind == "fail" and "no connection line" in res["msg"]
    assert res["logs"][0]["state"] == "pending"


def test_parser_reads_span_ring_set_up_channel_counts_and_nvls():
    f = facts_of("nccl1358_2gpu_nnodes1_direct.log")
    assert f.comm_nnodes == {1} and f.channel_counts == {"ring": 2}
    assert f.channel_transports == {"P2P/direct pointer": 1}  # "Ring 00 : 0 -> 1 -> 0" is not a connection
    f = facts_of("torchtitan1570_tp4_nvls_rings.log")  # lines behind torchrun's "[rank0]:" prefix
    assert f.nvls == "available" and f.channel_counts == {"ring": 24} and f.comm_nnodes == {1}
    f = facts_of("vllm6407_tp4_shm_p2p_ipc.log")
    assert f.channel_counts == {"coll": 2, "collnet": 0, "nvls": 0, "p2p": 2, "per_peer": 2}
    assert len(f.rings_connected) == 4 and len(f.trees_connected) == 1
    f = facts_of("nccl1814_8node_nvls_ibext.log")
    assert f.nvls_connected and f.channel_counts["nvls"] == 16
    assert f.channel_transports == {"P2P/CUMEM": 12, "NET/IBext_v8": 1}
    assert f.families() == {"P2P": 12, "NET": 1}


def test_intra_lines_are_kept_apart_from_the_network_evidence(run):
    log = str(FIX / "vllm6407_tp4_shm_p2p_ipc.log")
    kind, res = run("nccl_transport", {"log": log, "nnodes": 1, "require": "intra", "min_processes": 4})
    assert kind == "exit", res["msg"]
    entry = res["logs"][0]
    assert any("via SHM/direct/direct" in ln for ln in entry["intra_lines"])
    assert any("2 coll channels" in ln for ln in entry["intra_lines"])
    assert not any("via SHM" in ln for ln in entry["lines"])  # the IB gate's evidence is unchanged


def test_a_log_without_connection_lines_is_judged_as_before():
    """Old NCCL, a trimmed NCCL_DEBUG_SUBSYS or enginesim: without connection lines the IB gate decides
    on the NET/IB and 'Using network' lines alone, as it always did."""
    head = (FIX / "vllm6201_tp2_p2p_ipc_ib_plugin.log").read_text().splitlines()
    facts = NcclLogFacts()
    facts.feed_text("\n".join(ln for ln in head if " via " not in ln))
    assert judge(facts, [], "ib", 2)["state"] == "pass"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"nnodes": 2, "require": "intra"}, "require=intra with nnodes=2"),
        ({"nnodes": 1, "require": "intra", "intra_transports": ["NET"]}, "intra_transports=['NET']"),
    ],
)
def test_bad_intra_settings_are_refused(run, args, needle):
    kind, res = run("nccl_transport", {"log": str(FIX / "nccl1609_h800_4proc_shm.log"), **args})
    assert kind == "fail" and needle in res["msg"] and "rule:" in res["msg"]
