"""Two ranks over TCP: the head is healthy only when both are up; NCCL lines say IB or socket fallback."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
from es_helpers import free_port, wait_healthy

# the NCCL line grammar of docs/engine-surfaces.md (the parser quickmap's NCCL gate uses)
NET_IB_USING = re.compile(
    r"NET/IB ?: Using(?P<devs>.*?)\s*(?P<ro>\[RO\])?; OOB "
    r"(?P<oobif>[^\s:]+):(?P<oobaddr>\S+)<(?P<oobport>\d+)>\s*$"
)
NET_IB_DEV = re.compile(
    r"\[(?P<idx>\d+)\] ?(?P<dev>[A-Za-z0-9_.\-]+):(?P<port>\d+)(?::(?P<rail>\d*))?"
    r"(?::(?P<plane>\d+))?/(?P<ll>IB|RoCE|UNSPECIFIED)"
)
NET_SOCKET = re.compile(r"NET/Socket ?: Using(?P<devs>(?: \[\d+\][^\s:]+:\S+<\d+>)+)\s*$")
USING_NET = re.compile(r"Using network (?P<net>.+?)\s*$")


def _ib_dir(tmp_path: Path, names: list[str]) -> str:
    d = tmp_path / "infiniband"
    for n in names:
        (d / n / "ports" / "1").mkdir(parents=True)
        (d / n / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    return str(d)


def _two_ranks(start, tmp_path: Path, hcas_on_host: list[str]):
    dist = f"127.0.0.1:{free_port()}"
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1",
        "ENGINESIM_IB_DIR": _ib_dir(tmp_path, hcas_on_host),
    }
    args = [
        "sglang",
        "--model-path",
        "Qwen/Qwen3-0.6B",
        "--tp-size",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        dist,
    ]
    head = start([*args, "--node-rank", "0"], env=env, wait=False)
    return head, lambda: start([*args, "--node-rank", "1"], env=env, wait=False)


def _status(url: str) -> object:
    try:
        return httpx.get(url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return "down"


def _nets(log: str) -> list[str]:
    return [m.group("net") for line in log.splitlines() if (m := USING_NET.search(line))]


def test_head_healthy_only_when_both_ranks_up_and_fails_when_one_dies(start, tmp_path: Path) -> None:
    head, start_worker = _two_ranks(start, tmp_path, ["mlx5_0", "mlx5_1", "mlx5_3"])
    seen: list[object] = []
    end = time.monotonic() + 15
    while time.monotonic() < end and 503 not in seen:  # wait until the head's HTTP port answers
        seen.append(_status(head.url))
        time.sleep(0.05)
    end = time.monotonic() + 0.7
    while time.monotonic() < end:  # and keeps answering 503 while the worker is missing
        seen.append(_status(head.url))
        time.sleep(0.05)
    assert 503 in seen and 200 not in seen
    worker = start_worker()
    wait_healthy(head.url, head.proc)
    for srv in (head, worker):
        log = srv.text()
        using = [m for line in log.splitlines() if (m := NET_IB_USING.search(line))]
        assert using, log[-2000:]
        devs = [
            (d.group("dev"), d.group("port"), d.group("ll"))
            for d in NET_IB_DEV.finditer(using[0].group("devs"))
        ]
        assert devs == [("mlx5_0", "1", "IB"), ("mlx5_3", "1", "IB")]
        assert "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB " in log
        assert set(_nets(log)) == {"IB"}
    ok = httpx.post(
        head.url + "/generate", json={"input_ids": [300, 301], "sampling_params": {"max_new_tokens": 4}}
    )
    assert ok.status_code == 200
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(5)
    end = time.monotonic() + 8
    status = 200
    while time.monotonic() < end and status == 200:
        status = httpx.get(head.url + "/health", timeout=5).status_code
        time.sleep(0.05)
    assert status == 503
    failed = httpx.post(
        head.url + "/generate", json={"input_ids": [300], "sampling_params": {"max_new_tokens": 4}}
    )
    assert failed.status_code >= 500
    assert "NCCL WARN" in head.text() and "Connection closed by remote peer" in head.text()


def test_one_missing_hca_leaves_nccl_on_the_other_rail(start, tmp_path: Path) -> None:
    """NCCL_IB_HCA=mlx5_0:1,mlx5_3:1 with mlx5_3 gone: real NCCL uses mlx5_0 alone (one rail), as the
    emulator now prints; the gate's both-rails rule, not a socket fallback, is what catches it."""
    head, start_worker = _two_ranks(start, tmp_path, ["mlx5_0"])
    worker = start_worker()
    wait_healthy(head.url, head.proc)
    time.sleep(0.2)
    for srv in (head, worker):
        log = srv.text()
        assert "NET/IB : No device found." not in log
        assert "NET/IB : Using [0]mlx5_0:1/IB ; OOB " in log
        assert set(_nets(log)) == {"IB"}


def test_no_listed_hca_falls_back_to_socket_on_both_ranks(start, tmp_path: Path) -> None:
    head, start_worker = _two_ranks(start, tmp_path, ["mlx5_5"])
    worker = start_worker()
    wait_healthy(head.url, head.proc)
    time.sleep(0.2)
    for srv in (head, worker):
        log = srv.text()
        assert "NET/IB : No device found." in log
        assert any(NET_SOCKET.search(line) for line in log.splitlines())
        assert _nets(log) and set(_nets(log)) == {"Socket"}
        assert "Using network IB" not in log
