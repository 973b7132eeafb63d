"""Issue 16 item 1: the engines' fixed costs as data, fitted to public figures, and the README's table.

The published-figure table in enginesim/README.md is re-rendered here from a fresh replay of every row
(the same replay path `python -m enginesim replay` runs): a change to the cost model, a profile or a row
that moves a figure fails this test until the table is regenerated, so the README cannot drift.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from enginesim import catalog, cli, replay, scheduler
from enginesim.calibrate import published
from enginesim.capacity import compute
from enginesim.costmodel import ENGINE_COST_KEYS, CostModel

README = Path(__file__).resolve().parents[2] / "enginesim" / "README.md"
MEASURED = Path(__file__).resolve().parents[2] / "enginesim" / "data" / "measured" / "h200"


def _cost(argv: list[str]) -> CostModel:
    cfg = cli.parse(argv, {})
    model = catalog.load_model(cfg.model_path)
    hw = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)
    return scheduler.build_cost(cfg, model, hw, compute(cfg, model, hw))


def test_readme_table_is_what_the_replay_computes() -> None:
    rows = published.load_rows()
    live = published.replayable(rows)
    assert len(live) >= 8
    assert {r["engine"] for r in live} == {"sglang", "vllm"}
    fresh = published.markdown(published.compare_all(rows))
    committed = published.readme_table(README.read_text())
    assert committed, "enginesim/README.md has no published-figure table between the markers"
    assert committed == fresh, "regenerate with: python -m enginesim.calibrate.published table"


def test_every_fit_names_a_row_figure_and_a_cost_field() -> None:
    rows = {r["id"]: r for r in published.load_rows()}
    engines = json.loads(resources.files("enginesim").joinpath("data", "engines.json").read_text())["engines"]
    assert set(engines) == {"sglang", "vllm"}
    for name, prof in engines.items():
        assert set(prof["costs_s"]) == set(ENGINE_COST_KEYS), name
        assert all(v >= 0 for v in prof["costs_s"].values()), name
        for fit in prof["fitted_on"]:
            assert fit["param"] in ENGINE_COST_KEYS
            row = rows[fit["row"]]
            cmp = next(c for c in row["compare"] if c["figure"] == fit["figure"])
            assert cmp["role"] == f"fit ({fit['param']})", (name, fit)
    # and every figure marked as fitted is one a profile names (no silent fits)
    named = {(f["row"], f["figure"]) for p in engines.values() for f in p["fitted_on"]}
    for r in rows.values():
        for c in r.get("compare", []):
            assert c["role"].startswith("fit") == ((r["id"], c["figure"]) in named), (r["id"], c)


def test_lm_head_counts_one_row_per_prefill_sequence() -> None:
    """A 4,096-token prefill computes logits for its last token only (real engines prune the rest)."""
    model = catalog.load_model("Qwen/Qwen3-0.6B")
    hw = catalog.load_hardware("h200")
    cm = CostModel(model, hw, 1, 1, 1, model.kv_bytes_per_token(2, 1), True, 256, False)
    emb = model.vocab * model.hidden  # tied: the LM head is the embedding matrix
    body = 2.0 * (model.active_params - emb) * 4096
    attn = 4.0 * model.layers * model.heads * model.head_dim * 4096 * 2048
    expected = (body + 2.0 * emb + attn) / (hw.peak_flops * hw.eff_compute)
    assert cm.step([(4096, 0)], 0, 0, 0).compute == pytest.approx(expected)
    # two sequences of 2,048 tokens: two logit rows, the same linear work
    two = cm.step([(2048, 0), (2048, 0)], 0, 0, 0).compute
    assert two * hw.peak_flops * hw.eff_compute == pytest.approx(body + 4.0 * emb + attn / 2)
    # a decode token still computes its logits
    assert cm.step([], 8, 8, 0).compute * hw.peak_flops * hw.eff_compute == pytest.approx(
        2.0 * (model.active_params - emb) * 8 + 2.0 * emb * 8
    )


@pytest.mark.parametrize(
    ("raw", "model"),
    [("raw.json", "Qwen/Qwen3-0.6B"), ("llama8b-raw.json", "meta-llama/Llama-3.1-8B-Instruct")],
)
def test_bare_decode_steps_match_the_h200_measurement(raw: str, model: str) -> None:
    """The stock h200 profile without engine costs against the measured whole steps (graph and eager).

    The old model (4 us x 12 kernels per layer eager, no per-kernel floor) gave 0.17-0.40 of the
    measured Qwen3-0.6B steps up to batch 16; within 25 % now.
    """
    from enginesim.calibrate.compare import price, rows_of

    spec = catalog.load_model(model)
    hw = catalog.load_hardware("h200")
    data = json.loads((MEASURED / raw).read_text())
    rows = [r for r in rows_of(data) if "prompt_tokens" not in r and r["batch"] <= 64]
    assert len(rows) >= 8
    for r in rows:
        ratio = price(spec, hw, r) / r["median_s"]
        assert 0.75 <= ratio <= 1.25, (r["batch"], r.get("cuda_graph"), ratio)


def test_hardware_fit_reproduces_the_committed_overheads() -> None:
    raws = [json.loads((MEASURED / f).read_text()) for f in ("raw.json", "llama8b-raw.json")]
    fit = published.fit_hardware(raws)
    ov = catalog.load_hardware("h200").overheads
    assert ov["kernel_floor"] == pytest.approx(fit["kernel_floor"], rel=0.05)
    assert ov["kernel_launch"] == pytest.approx(fit["kernel_launch"], rel=0.05)


def test_engine_costs_come_from_the_engine_profile() -> None:
    sgl = _cost(["sglang", "--model-path", "Qwen/Qwen3-0.6B"])
    vll = _cost(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"])
    costs = {e: catalog.load_engine_costs(e) for e in ("sglang", "vllm")}
    assert sgl.step_cpu == costs["sglang"]["step_cpu"] + costs["sglang"]["sampling"]
    assert vll.step_cpu == costs["vllm"]["step_cpu"] + costs["vllm"]["sampling"]
    assert vll.intake(1000) == pytest.approx(
        costs["vllm"]["intake"] + 1000 * costs["vllm"]["intake_per_token"]
    )
    model = catalog.load_model("Qwen/Qwen3-0.6B")
    bare = CostModel(
        model, catalog.load_hardware("h200"), 1, 1, 1, model.kv_bytes_per_token(2, 1), True, 256, False
    )
    assert bare.intake(1000) == 0.0
    dressed = CostModel(
        model, catalog.load_hardware("h200"), 1, 1, 1, model.kv_bytes_per_token(2, 1), True, 256, False,
        engine=costs["sglang"],
    )  # fmt: skip
    added = dressed.step([], 4, 4, 4096).total - bare.step([], 4, 4, 4096).total
    assert added == pytest.approx(costs["sglang"]["step_cpu"] + 4 * costs["sglang"]["per_request_cpu"])
    with pytest.raises(KeyError, match="no engine profile for 'trtllm'"):
        catalog.load_engine_costs("trtllm")


def test_intake_delays_the_first_token_not_the_running_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Intake is a latency (another process tokenises while the GPU steps), so it adds to TTFT and
    leaves the decode steps of the requests already running alone."""
    argv = ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--isl", "256", "--osl", "64"]
    base = dict(catalog.load_engine_costs("sglang"))

    def run(intake: float, concurrency: int) -> dict:
        monkeypatch.setattr(catalog, "load_engine_costs", lambda _f: {**base, "intake": intake})
        cfg, w = replay.parse(
            [*argv, "--concurrency", str(concurrency), "--num-prompts", str(2 * concurrency)]
        )
        return replay.run(cfg, w)

    fast, slow = run(0.0, 1), run(0.05, 1)
    assert slow["median_ttft_ms"] - fast["median_ttft_ms"] == pytest.approx(50.0, abs=0.01)
    assert slow["median_tpot_ms"] == pytest.approx(fast["median_tpot_ms"])
    # under load, a late arrival is not a stall: the batch's inter-token gaps do not grow by 50 ms
    busy_fast, busy_slow = run(0.0, 16), run(0.05, 16)
    assert busy_slow["max_itl_ms"] < busy_fast["max_itl_ms"] + 5.0
