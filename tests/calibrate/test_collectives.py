"""The collectives measurement: TP message sizes, nccl-tests' bus bandwidth, host trimming, and the CPU
(gloo) path end to end, which is what CI can run: the output must say backend=gloo, never a GPU figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from enginesim.calibrate import comm_plan, nccl_files

REPO = Path(__file__).resolve().parents[2]


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    """nccl-tests' definition (doc/PERFORMANCE in NVIDIA/nccl-tests).

    all-reduce busbw = algbw * 2(n-1)/n, all-gather busbw = algbw * (n-1)/n.
    """
    alg, bus = comm_plan.bus_bandwidth("all_reduce", 1_000_000, 1e-3, 8)
    assert alg == pytest.approx(1e9) and bus == pytest.approx(1.75e9)
    alg, bus = comm_plan.bus_bandwidth("all_gather", 1_000_000, 1e-3, 4)
    assert bus == pytest.approx(0.75e9)
    assert comm_plan.bus_bandwidth("all_reduce", 100, 1.0, 2)[1] == pytest.approx(100.0)
    with pytest.raises(ValueError):
        comm_plan.bus_bandwidth("all_reduce", 100, 0.0, 2)


def test_messages_are_tokens_times_hidden_in_bf16_each_size_once() -> None:
    hiddens = comm_plan.hidden_sizes(
        ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-2-7b-hf", "deepseek-ai/DeepSeek-V3"]
    )
    assert hiddens == {
        4096: ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-2-7b-hf"),
        7168: ("deepseek-ai/DeepSeek-V3",),
    }
    msgs = comm_plan.messages(hiddens, (1, 256), (8192,))
    assert len(msgs) == 2 * 2 * 3
    ar = [m for m in msgs if m.collective == "all_reduce"]
    assert [m.nbytes for m in ar] == [8192, 14336, 2097152, 3670016, 67108864, 117440512]
    assert {m.phase for m in ar if m.tokens == 8192} == {"prefill"}
    plan = comm_plan.gpu_plan(list(comm_plan.DEFAULT_MODELS), (2, 4, 8))
    assert plan.backend == "nccl" and plan.world_sizes == (2, 4, 8)
    assert {m.hidden for m in plan.messages} == {4096, 5120, 7168}


def test_trim_replaces_host_names_and_addresses_consistently() -> None:
    text = (
        "gpu-node-17:81234:81234 [0] NCCL INFO Bootstrap : Using eth0:172.31.4.9<0>\n"
        "gpu-node-17:81235:81235 [1] NCCL INFO cudaDriverVersion 12040\n"
        "[1712345.67] gpu-node-17:81234:81299 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
        "gpu-node-17:81234:81299 [0] NCCL INFO NET/Socket : Using [0]eth0:172.31.4.9<0> [1]eth1:10.1.2.3<0>\n"
    )
    hosts: dict[str, str] = {}
    out = nccl_files.trim_text(text, hosts, {})
    assert "gpu-node-17" not in out and "172.31.4.9" not in out and "10.1.2.3" not in out
    assert out.splitlines()[0] == "node0:81234:81234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>"
    assert out.splitlines()[2].startswith("[1712345.67] node0:81234:81299 [0] NCCL INFO Channel 00/0")
    assert "[0]eth0:10.0.0.1<0> [1]eth1:10.0.0.2<0>" in out
    assert hosts == {"gpu-node-17": "node0"}


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginesim.calibrate.collectives", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        check=False,
    )


@pytest.mark.slow
def test_cpu_run_uses_gloo_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "coll"
    r = _run(out)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "collectives.json").read_text())
    assert doc["device"] == "cpu" and doc["backend"] == "gloo" and "says nothing about a GPU" in doc["note"]
    assert doc["errors"] == {} and doc["nccl_logs"] == {} and not (out / "nccl").exists()
    assert (
        doc["env"]["nccl_env"]["NCCL_DEBUG"] == "INFO" and doc["env"]["nccl_env"]["NCCL_NVLS_ENABLE"] == "0"
    )
    rows = doc["results"]["2"]
    assert {(r["collective"], r["tokens"]) for r in rows} == {
        (c, t) for c in ("all_reduce", "all_gather") for t in (1, 8, 64)
    }
    for row in rows:
        assert row["correct"] is True and row["world_size"] == 2 and row["dtype"] == "bf16"
        assert row["nbytes"] == row["tokens"] * 64 * 2
        assert len(row["samples_s"]) == 5 and row["min_s"] <= row["median_s"] <= row["max_s"]
        assert row["busbw_bytes_per_s"] == pytest.approx(
            comm_plan.bus_bandwidth(row["collective"], row["nbytes"], row["median_s"], 2)[1]
        )
        assert len(row["per_rank_median_s"]) == 2
    assert "backend gloo on cpu" in r.stdout
    again = _run(out)
    assert again.returncode == 2 and "collectives.json already exists" in again.stderr


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path) -> None:
    r = _run(tmp_path / "a", "--world-sizes", "1")
    assert r.returncode == 2 and "every size must be >= 2" in r.stderr
    r = _run(tmp_path / "b", "--models", "no/such-model")
    assert r.returncode == 2 and "--models 'no/such-model'" in r.stderr
    r = _run(tmp_path / "c", "--device", "cuda")
    assert r.returncode == 2 and "--device cuda: no CUDA device" in r.stderr
    assert not (tmp_path / "c" / "collectives.json").exists()
