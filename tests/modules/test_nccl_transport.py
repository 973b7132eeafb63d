"""nccl_transport: the NCCL gate passes only on NET/IB with exactly the expected HCAs, fails closed otherwise.

Log snippets are built from the NCCL format strings described in docs/engine-surfaces.md (NCCL section)
(prefix ``host:pid:tid [dev] NCCL INFO``), interleaved with SGLang's own lines as in a real server log.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from ansible.module_utils.nccl_log import NcclLogFacts, parse_hca_specs, parse_ib_devices

SGLANG_HEAD = [
    "[2026-12-02 14:00:01] server_args=ServerArgs(model_path='/models/Qwen3', tp_size=16, nnodes=2)",
    "[2026-12-02 14:00:05 TP0] Init torch distributed begin.",
]
SGLANG_TAIL = [
    "[2026-12-02 14:00:09 TP0] Init torch distributed ends. mem usage=0.61 GB",
    "[2026-12-02 14:00:21 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=61.09 GB, mem usage=15.54 GB.",
]


def nccl(host: str, pid: int, msg: str, dev: int = 0, tid: int | None = None) -> str:
    """One NCCL INFO line in the 2.18+ prefix format."""
    return f"{host}:{pid}:{tid or pid + 56} [{dev}] NCCL INFO {msg}"


def ib_log(
    host: str = "node-a",
    addr: str = "10.0.0.1",
    devices: str = "[0]mlx5_0:1/IB [1]mlx5_3:1/IB",
    net: str = "IB",
    pids: tuple[int, ...] = (1234,),
) -> str:
    """A server log in which each rank initialises NCCL over IB with ``devices``."""
    lines = list(SGLANG_HEAD)
    for rank, pid in enumerate(pids):
        lines += [
            nccl(host, pid, f"Bootstrap : Using eth0:{addr}<0>", rank),
            nccl(host, pid, "NET/Plugin: No plugin found (libnccl-net.so)", rank),
            nccl(host, pid, "NET/Plugin: Using internal network plugin.", rank),
            nccl(host, pid, "NCCL version 2.21.5+cuda12.4", rank),
            nccl(host, pid, "NCCL_IB_HCA set to =mlx5_0:1,mlx5_3:1", rank),
            nccl(host, pid, f"NET/IB : Using {devices} [RO]; OOB eth0:{addr}<0>", rank),
            nccl(host, pid, "Using non-device net plugin version 0", rank),
            nccl(host, pid, f"Using network {net}", rank),
            nccl(
                host,
                pid,
                f"comm 0x55d0c1 rank {rank} nRanks 16 nNodes 2 localRanks 8 localRank {rank} MNNVL 0",
                rank,
            ),
            nccl(host, pid, f"Channel 00/0 : 15[7] -> {rank}[{rank}] [receive] via NET/{net}/0/GDRDMA", rank),
            nccl(host, pid, f"Channel 00/0 : {rank}[{rank}] -> 1[1] via P2P/CUMEM/read", rank),
            nccl(host, pid, "Init COMPLETE", rank),
        ]
    return "\n".join(lines + SGLANG_TAIL) + "\n"


def socket_fallback_log(host: str = "node-b", addr: str = "10.0.0.2") -> str:
    """NCCL found no HCA (missing --device) and fell back to TCP sockets."""
    pid = 4321
    lines = [
        *SGLANG_HEAD,
        nccl(host, pid, f"Bootstrap : Using eth0:{addr}<0>"),
        nccl(host, pid, "NCCL version 2.21.5+cuda12.4"),
        nccl(host, pid, "NET/IB : No device found."),
        nccl(host, pid, f"NET/Socket : Using [0]eth0:{addr}<0> [1]eth3:10.0.3.2<0>"),
        nccl(host, pid, "Using network Socket"),
        nccl(host, pid, "Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0"),
        *SGLANG_TAIL,
    ]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


HCAS = ["mlx5_0:1", "mlx5_3:1"]


def test_ib_on_both_hcas_in_both_logs_passes_and_saves_verdict(run, tmp_path):
    head = write(tmp_path, "head.log", ib_log("node-a", "10.0.0.1", pids=(1234, 1235)))
    worker = write(tmp_path, "worker.log", ib_log("node-b", "10.0.0.2"))
    dest = tmp_path / "server" / "head_nccl_gate.json"
    kind, res = run(
        "nccl_transport",
        {"logs": [head, worker], "expected_hcas": HCAS, "nnodes": 2, "timeout": 5, "dest": str(dest)},
    )
    assert kind == "exit", res["msg"]
    assert res["passed"] is True and res["changed"] is False
    assert res["waited_s"] < 4  # decided at once, no waiting for the timeout
    assert [e["transport"] for e in res["logs"]] == ["ib", "ib"]
    assert res["logs"][0]["hcas"] == ["mlx5_0:1", "mlx5_3:1"]
    assert res["logs"][0]["oob_if"] == "eth0"
    assert res["logs"][0]["processes"] == 2
    assert res["logs"][1]["gdr"] is True
    assert res["logs"][0]["nccl_version"] == "2.21.5"
    assert any("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB" in ln for ln in res["logs"][1]["lines"])
    assert not any("P2P/CUMEM" in ln for ln in res["logs"][0]["lines"])  # evidence = network lines only
    saved = json.loads(dest.read_text())
    assert saved["passed"] is True and saved["schema"] == "quickmap.nccl_gate/1"
    assert saved["logs"][1]["path"] == worker and saved["logs"][1]["hcas"] == HCAS
    assert res["dest_written"] is True
    assert list(dest.parent.iterdir()) == [dest]  # no temp file left behind


def test_check_mode_reports_but_does_not_write_dest(run, tmp_path):
    log = write(tmp_path, "head.log", ib_log())
    dest = tmp_path / "gate.json"
    kind, res = run(
        "nccl_transport",
        {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1, "dest": str(dest)},
        check_mode=True,
    )
    assert kind == "exit" and res["passed"] is True
    assert res["dest_written"] is False and res["would_write"] == str(dest)
    assert not dest.exists()


def test_one_expected_hca_missing_fails_naming_it(run, tmp_path):
    worker = write(tmp_path, "worker.log", ib_log("node-b", devices="[0]mlx5_0:1/IB"))
    kind, res = run("nccl_transport", {"logs": [worker], "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "fail"
    assert res["passed"] is False
    assert worker in res["msg"] and "expected HCA mlx5_3:1 missing" in res["msg"]
    assert res["logs"][0]["hcas"] == ["mlx5_0:1"]
    assert res["logs"][0]["state"] == "fail"


def test_no_device_found_and_socket_fallback_fail_closed(run, tmp_path):
    worker = write(tmp_path, "worker.log", socket_fallback_log())
    dest = tmp_path / "worker_nccl_gate.json"
    kind, res = run(
        "nccl_transport",
        {"log": worker, "expected_hcas": HCAS, "nnodes": 2, "timeout": 5, "dest": str(dest)},
    )
    assert kind == "fail"
    assert res["waited_s"] < 4  # a fail-closed line ends the wait at once
    assert "No device found" in res["msg"] and "socket fallback" in res["msg"]
    log = res["logs"][0]
    assert log["transport"] == "socket" and log["net"] == ["Socket"] and log["hcas"] == []
    assert any("NET/Socket : Using [0]eth0" in p for p in log["problems"])
    assert any("Using network Socket" in p for p in log["problems"])
    saved = json.loads(dest.read_text())  # the verdict and its evidence are saved on failure too
    assert saved["passed"] is False and any("No device found" in ln for ln in saved["logs"][0]["lines"])


def test_empty_ib_device_list_after_no_device_found_fails(run, tmp_path):
    # NCCL >= 2.24 prints an empty "Using" line after "No device found."
    text = "\n".join(
        [
            nccl("node-b", 77, "NET/IB : No device found."),
            nccl("node-b", 77, "NET/IB : Using ; OOB eth0:10.0.0.2<0>"),
        ]
    )
    log = write(tmp_path, "worker.log", text + "\n")
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "fail"
    assert "NET/IB line lists no devices" in " ".join(res["logs"][0]["problems"])


def test_ib_line_with_other_devices_fails(run, tmp_path):
    log = write(tmp_path, "head.log", ib_log(devices="[0]mlx5_1:1/IB [1]mlx5_3:1/IB"))
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "fail"
    assert "mlx5_1:1 which is not an expected HCA" in res["msg"]
    assert "expected HCA mlx5_0:1 missing" in " ".join(res["logs"][0]["problems"])


def test_port_given_must_match_the_logged_port(run, tmp_path):
    log = write(tmp_path, "head.log", ib_log(devices="[0]mlx5_0:2/IB [1]mlx5_3:1/IB"))
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "fail" and "mlx5_0:2 which is not an expected HCA" in res["msg"]
    # Without ports in the expectation any port of the named HCA is fine.
    kind, res = run(
        "nccl_transport", {"log": log, "expected_hcas": ["mlx5_0", "mlx5_3"], "nnodes": 2, "timeout": 1}
    )
    assert kind == "exit" and res["passed"] is True


def test_no_nccl_line_times_out_and_fails(run, tmp_path):
    log = write(tmp_path, "head.log", "\n".join(SGLANG_HEAD + SGLANG_TAIL) + "\n")
    kind, res = run(
        "nccl_transport",
        {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 0.3, "poll_interval": 0.1},
    )
    assert kind == "fail"
    assert res["waited_s"] >= 0.3
    assert "no NCCL line" in res["msg"] and "NCCL_DEBUG=INFO" in res["msg"] and "timeout" in res["msg"]
    assert res["logs"][0]["state"] == "pending" and res["logs"][0]["transport"] == "none"


def test_missing_log_file_times_out_and_fails(run, tmp_path):
    missing = str(tmp_path / "nope.log")
    kind, res = run("nccl_transport", {"log": missing, "nnodes": 2, "timeout": 0.2, "poll_interval": 0.1})
    assert kind == "fail"
    assert missing in res["msg"] and "file does not exist" in res["msg"]
    assert res["logs"][0]["exists"] is False


def test_lines_that_appear_while_polling_are_picked_up(run, tmp_path):
    path = tmp_path / "head.log"
    path.write_text("\n".join(SGLANG_HEAD) + "\n")

    def server_reaches_nccl_init() -> None:
        with path.open("a") as handle:
            handle.write(ib_log())

    timer = threading.Timer(0.4, server_reaches_nccl_init)
    timer.start()
    try:
        kind, res = run(
            "nccl_transport",
            {"log": str(path), "expected_hcas": HCAS, "nnodes": 2, "timeout": 10, "poll_interval": 0.1},
        )
    finally:
        timer.cancel()
    assert kind == "exit", res["msg"]
    assert 0.3 <= res["waited_s"] < 9
    assert res["logs"][0]["transport"] == "ib"


def test_two_logs_one_bad_fails_naming_only_the_bad_one(run, tmp_path):
    head = write(tmp_path, "head.log", ib_log("node-a"))
    worker = write(tmp_path, "worker.log", socket_fallback_log("node-b"))
    kind, res = run(
        "nccl_transport", {"logs": [head, worker], "expected_hcas": HCAS, "nnodes": 2, "timeout": 2}
    )
    assert kind == "fail"
    assert worker in res["msg"] and head not in res["msg"]
    assert [e["passed"] for e in res["logs"]] == [True, False]
    assert [e["transport"] for e in res["logs"]] == ["ib", "socket"]


def test_single_node_passes_trivially_but_reports_what_it_saw(run, tmp_path):
    log = write(tmp_path, "head.log", socket_fallback_log("node-a"))
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 1, "timeout": 30})
    assert kind == "exit"
    assert res["passed"] is True and res["waited_s"] < 5
    assert res["msg"].startswith("single node: no inter-node transport")
    assert res["logs"][0]["transport"] == "socket"
    assert any("NET/IB : No device found." in ln for ln in res["logs"][0]["lines"])


def test_min_processes_waits_for_every_rank(run, tmp_path):
    log = write(tmp_path, "head.log", ib_log(pids=(11, 12)))
    kind, res = run(
        "nccl_transport",
        {
            "log": log,
            "expected_hcas": HCAS,
            "nnodes": 2,
            "timeout": 0.2,
            "poll_interval": 0.1,
            "min_processes": 8,
        },
    )
    assert kind == "fail" and "2 process(es) report 'Using network IB', need 8" in res["msg"]


def test_ib_plugin_and_newer_device_tokens_count_as_ib(run, tmp_path):
    # nccl-rdma-sharp plugin name and the HEAD token with rail/plane ids.
    log = write(tmp_path, "head.log", ib_log(devices="[0]mlx5_0:1:2/IB [1]mlx5_3:1::3/IB", net="IBext_v8"))
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "exit", res["msg"]
    assert res["logs"][0]["net"] == ["IBext_v8"]


def test_ib_devices_but_socket_network_fails(run, tmp_path):
    log = write(tmp_path, "head.log", ib_log(net="Socket"))
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "fail" and "socket fallback" in res["msg"]


@pytest.mark.parametrize(
    ("hcas", "needle"),
    [(["^mlx5_0"], "exclusion list"), (["mlx5 0"], "is not an HCA"), (["mlx5_0:x"], "port 'x'")],
)
def test_bad_expected_hcas_are_refused_with_the_rule(run, tmp_path, hcas, needle):
    log = write(tmp_path, "head.log", ib_log())
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": hcas, "nnodes": 2, "timeout": 1})
    assert kind == "fail" and needle in res["msg"] and "rule" in res["msg"]


def test_nccl_ib_hca_string_is_accepted_as_expectation():
    assert parse_hca_specs(["=mlx5_0:1,mlx5_3:1"]) == [
        {"name": "mlx5_0", "port": 1},
        {"name": "mlx5_3", "port": 1},
    ]
    assert parse_hca_specs(["mlx5_0", "mlx5_0"]) == [{"name": "mlx5_0", "port": None}]


def test_merged_nic_tokens_are_parsed():
    devs = parse_ib_devices(" [0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE}")
    assert [(d["name"], d["port"], d["link"]) for d in devs] == [("mlx5_0", 1, "RoCE"), ("mlx5_1", 1, "RoCE")]


def test_timestamped_warn_and_glued_lines_are_read():
    facts = NcclLogFacts()
    facts.feed(
        "[2026-12-02 14:00:00] node-a:9:9 [0] transport/net_ib.cc:123 NCCL WARN "
        "NET/IB : Unable to open device mlx5_3"
    )
    facts.feed(
        "INFO:root:x node-a:9:10 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:fe80::1%ib0<0>\r"
    )
    assert facts.warnings and "Unable to open device mlx5_3" in facts.warnings[0]
    assert facts.hcas_used() == ["mlx5_0:1"] and facts.oob_ifs() == ["eth0"]


def test_channel_lines_cannot_crowd_out_the_deciding_lines():
    facts = NcclLogFacts()
    for pid in range(100, 108):
        for ch in range(40):
            facts.feed(nccl("node-a", pid, f"Channel {ch:02d}/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA"))
    for pid in range(100, 108):
        facts.feed(nccl("node-a", pid, "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB eth0:10.0.0.1<0>"))
    kept_ib = [ln for ln in facts.evidence if "NET/IB : Using" in ln]
    assert len(kept_ib) == 8
    assert facts.evidence_dropped == 8 * 40 - 50


def test_engine_dying_before_nccl_init_ends_the_wait(run, tmp_path):
    text = "\n".join(
        [
            *SGLANG_HEAD,
            "[2026-12-02 14:00:07 TP3] Scheduler hit an exception: Traceback (most recent call last):",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
            "capacity of 79.19 GiB of which 1.06 GiB is free.",
            "[2026-12-02 14:00:08] Received sigquit from a child process. It usually means the child failed.",
        ]
    )
    log = write(tmp_path, "head.log", text + "\n")
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 20})
    assert kind == "fail" and res["waited_s"] < 10
    assert "server failed before NCCL reported its transport" in res["msg"]
    assert "Scheduler hit an exception" in res["logs"][0]["engine_errors"][0]


def test_engine_error_after_a_decided_ib_verdict_does_not_flip_it(run, tmp_path):
    text = ib_log() + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.\n"
    log = write(tmp_path, "head.log", text)
    kind, res = run("nccl_transport", {"log": log, "expected_hcas": HCAS, "nnodes": 2, "timeout": 1})
    assert kind == "exit" and res["logs"][0]["engine_errors"]
