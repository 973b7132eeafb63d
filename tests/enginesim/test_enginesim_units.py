"""Pure-Python parts: tokenizer round trips, radix granularity, NCCL HCA selection, cost model direction."""

from enginesim import catalog, nccl
from enginesim.costmodel import CostModel
from enginesim.radix import RadixCache
from enginesim.tokenizer import Tokenizer


def test_tokenizer_round_trips_text_and_word_ids() -> None:
    tok = Tokenizer(151936)
    text = "Hello world, the quick brown fox. Ünïcode  and  spaces\n"
    assert tok.decode(tok.encode(text)) == text
    ids = [256 + (i * 7919) % (151936 - 256) for i in range(500)]
    assert tok.encode(tok.decode(ids)) == ids


def test_radix_granularity_sglang_token_vllm_block() -> None:
    seq = list(range(1000, 3080))
    sgl, vllm = RadixCache(1), RadixCache(16)
    sgl.insert(seq)
    vllm.insert(seq)
    probe = [*seq[:2070], 7, 7]
    assert sgl.match(probe)[0] == 2070
    assert vllm.match(probe)[0] == 2064


def test_hca_selection_rules() -> None:
    devs = ["mlx5_0", "mlx5_1", "mlx5_3"]
    assert nccl.select_hcas("mlx5_0:1,mlx5_3:1", devs) == [("mlx5_0", 1), ("mlx5_3", 1)]
    # Real NCCL skips a listed HCA that does not exist and uses the rest; none left = no device.
    assert nccl.select_hcas("=mlx5_0:1,mlx5_5:1", devs) == [("mlx5_0", 1)]
    assert nccl.select_hcas("=mlx5_5,mlx5_6", devs) is None
    assert nccl.select_hcas("^=mlx5_0", devs) == [("mlx5_1", 1), ("mlx5_3", 1)]
    assert nccl.select_hcas(None, []) is None


def test_tensor_parallel_adds_allreduce_and_cross_node_costs_more() -> None:
    m = catalog.load_model("meta-llama/Llama-2-13b-hf")
    hw = catalog.load_hardware("h100")
    kv = m.kv_bytes_per_token(2, 2)
    intra = CostModel(m, hw, 2, 1, 1, kv, True, 256, False).step([], 64, 64, 64 * 1000)
    inter = CostModel(m, hw, 2, 1, 2, kv, True, 256, False).step([], 64, 64, 64 * 1000)
    assert intra.comm > 0
    assert inter.comm > intra.comm
