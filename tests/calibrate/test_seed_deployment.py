"""The seed deployment in the emulator: DeepSeek-V4-Pro, TP16/EP2 over two 8-GPU RTX PRO 6000 nodes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from calib_helpers import engines, free_port, ready_info

from enginesim import catalog


def test_seed_profiles_and_model_load_with_their_sources() -> None:
    hw = catalog.load_hardware("rtx-pro-6000-server")
    assert hw.mem_bytes == 96e9 and hw.mem_bw == 1.792e12 and hw.gpus_per_node == 8
    assert "PCIe Gen5" in hw.source
    d = catalog.load_hardware("rtx-pro-6000d")
    assert d.mem_bytes == 84e9 and d.mem_bw < hw.mem_bw and d.peak_flops < hw.peak_flops
    assert "No NVIDIA datasheet" in d.source
    m = catalog.load_model("/models/DeepSeek-V4-Pro")  # matched by the path's last component
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (61, 7168, 128, 1, 512)
    assert (m.experts, m.experts_per_token, m.moe_intermediate) == (384, 6, 3072)
    assert m.mla and m.kv_lora_rank + m.qk_rope_head_dim == 512
    assert m.total_params == 1.6e12 and m.active_params == 49e9
    # 1.6T weights at fp4/fp8 fit 16 GPUs of 96 GB; at one byte per weight they would not
    assert m.weight_bytes_per_gpu(16) < 0.6 * hw.mem_bytes < 1.6e12 / 16
    assert "huggingface" in m.extra["source"].lower() or "hugging face" in m.extra["source"].lower()
    assert "6x too large" in m.extra["emulation_limits"]


@pytest.mark.slow
def test_two_ranks_serve_v4_pro_tp16_ep2_on_rtx_pro_6000(tmp_path: Path) -> None:
    port = free_port()
    args = [
        "sglang",
        "--model-path",
        "/models/DeepSeek-V4-Pro",
        "--tp-size",
        "16",
        "--ep-size",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        f"127.0.0.1:{free_port()}",
        "--mem-fraction-static",
        "0.9",
        "--sim-hardware",
        "rtx-pro-6000-server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with engines([[*args, "--node-rank", "0"], [*args, "--node-rank", "1"]], tmp_path) as (head, _worker):
        url = f"http://127.0.0.1:{port}"
        info = ready_info(url, head)
        assert info["enginesim"]["hardware"] == "rtx-pro-6000-server"
        assert info["tp_size"] == 16 and info["ep_size"] == 2
        assert info["max_total_num_tokens"] > 100_000
        r = httpx.post(
            url + "/generate",
            json={"text": "hello world", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}},
            timeout=30,
        )
        assert r.status_code == 200
        assert r.json()["meta_info"]["completion_tokens"] == 8
    log = (tmp_path / "engine0.log").read_text()
    assert "type=DeepseekV4ForCausalLM" in log
