"""`python -m enginesim replay`: the live server's scheduler and cost model in pure virtual time, with
loadgen's key names and metric definitions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from es_helpers import REPO

from enginesim import catalog, cli, engine, replay, scheduler
from enginesim.capacity import compute
from loadgen import results as lg_results
from loadgen.records import RequestRecord

SGL = ["sglang", "--model-path", "Qwen/Qwen3-0.6B", "--cuda-graph-max-bs", "64"]


def _replay(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginesim", "replay", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _loadgen_keys() -> set[str]:
    """The keys loadgen writes: its workload keys (schema quickmap.loadgen/1) and the summary its own
    result builder computes (one finished 3-token request)."""
    workload = ("random_input_len", "random_output_len", "num_prompts", "max_concurrency", "request_rate")
    cfg = {"t0_epoch_s": 0.0, "seed": 1, **dict.fromkeys(workload)}
    rec = RequestRecord(0, 0, 0, 1, 4, 200, None, None, [2, 3, 4], [1, 1, 1], 3, 8, "server", None, 2, 0)
    return set(lg_results.build(cfg, [rec], 0, 0, 4, [], False, True, 25.0, []))


def test_replay_speaks_loadgen_keys_and_definitions() -> None:
    cp = _replay([*SGL, "--isl", "512", "--osl", "64", "--concurrency", "1", "--num-prompts", "3"])
    assert cp.returncode == 0, cp.stderr
    res = json.loads(cp.stdout)
    shared = {k for k in res if k not in ("tool", "enginesim_replay", "injected")}
    assert shared <= _loadgen_keys(), shared - _loadgen_keys()
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                "output_throughput", "completed", "duration", "median_itl_per_token_ms"):  # fmt: skip
        assert key in res, key
    # Definitions, against the cost model itself: C=1, so TTFT is the engine's intake latency plus
    # one 512-token prefill step, and every ITL one decode step over the growing context.
    cfg = cli.parse(SGL, {})
    model = catalog.load_model(cfg.model_path)
    hw = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)
    cost = scheduler.build_cost(cfg, model, hw, compute(cfg, model, hw))
    assert cost.intake(512, False) > 0
    assert res["median_ttft_ms"] == pytest.approx(
        (cost.intake(512, False) + cost.step([(512, 0)], 0, 0, 0).total) * 1e3
    )
    steps = [cost.step([], 1, 1, 512 + k).total * 1e3 for k in range(63)]
    assert res["mean_itl_ms"] == pytest.approx(sum(steps) / len(steps))
    assert res["median_tpot_ms"] == pytest.approx(res["mean_itl_ms"])  # TPOT = (E2E - TTFT)/(n - 1)
    assert res["completed"] == 3 and res["total_output_tokens"] == 3 * 64
    assert res["output_throughput"] == pytest.approx(res["total_output_tokens"] / res["duration"])


def test_replay_concurrency_queues_and_injection_stalls_decode() -> None:
    base = [*SGL, "--isl", "1024", "--osl", "128", "--concurrency", "4", "--num-prompts", "8"]
    plain = json.loads(_replay(base).stdout)
    assert plain["max_concurrent_requests"] == 4 and plain["mean_queue_time_ms"] > 0
    hit = json.loads(_replay([*base, "--inject", "32768:1@0.01"]).stdout)
    assert hit["injected"][0]["ttft_ms"] > 10 * plain["median_ttft_ms"]
    assert hit["max_itl_ms"] > 10 * plain["max_itl_ms"]  # SGLang stalls decode for the long prefill
    vllm = _replay(["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096", *base[len(SGL) :]])
    assert vllm.returncode == 0 and json.loads(vllm.stdout)["completed"] == 8, vllm.stderr


def test_replay_refuses_bad_workload_naming_the_flag() -> None:
    cp = _replay([*SGL, "--isl", "0", "--osl", "8", "--num-prompts", "1"])
    assert cp.returncode == 2 and "--isl" in cp.stderr
    cp = _replay([*SGL, "--isl", "8", "--osl", "8", "--num-prompts", "1", "--shared-prefix", "4:16"])
    assert cp.returncode == 2 and "--shared-prefix" in cp.stderr
    cp = _replay([*SGL, "--isl", "8", "--osl", "8", "--num-prompts", "1", "--no-such-flag"])
    assert cp.returncode == 2 and "--no-such-flag" in cp.stderr
    cp = _replay([*SGL, "--isl", "100000", "--osl", "8", "--num-prompts", "1"])
    assert cp.returncode == 1 and "context length" in cp.stderr


def test_live_engine_and_replay_share_one_scheduler() -> None:
    """No second copy of the scheduling logic: the live engine only drives the shared scheduler."""
    assert issubclass(engine.Engine, scheduler.Scheduler) and replay.Scheduler is scheduler.Scheduler
    for name in ("plan", "sgl_plan", "vllm_plan", "apply", "submit", "abort"):
        assert name not in vars(engine.Engine), name


def _ttft_ms(args: list[str]) -> float:
    cp = _replay(args)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)["median_ttft_ms"]


def test_replay_charges_tokenisation_only_to_text_prompts() -> None:
    """loadgen sends token ids, which an engine does not tokenise: the replay's default (ids) leaves the
    per-token intake out; `--prompt-format text` (the public clients) keeps it."""
    work = ["--isl", "4096", "--osl", "1", "--concurrency", "1", "--num-prompts", "3"]
    cost = _sgl_cost()
    ids = _ttft_ms([*SGL, *work])
    text = _ttft_ms([*SGL, *work, "--prompt-format", "text"])
    assert ids == pytest.approx(_ttft_ms([*SGL, *work, "--prompt-format", "ids"]))
    assert text - ids == pytest.approx(cost.intake_per_token * 4096 * 1e3, rel=1e-6)
    # cold_prefill_4k as loadgen sends it: the fixed intake and the prefill step, no tokenisation
    prefill = cost.step([(4096, 0)], 0, 0, 0).total
    assert ids == pytest.approx((cost.intake_fixed + prefill) * 1e3)


def test_replay_refuses_an_unknown_prompt_format() -> None:
    cp = _replay([*SGL, "--isl", "8", "--osl", "1", "--num-prompts", "1", "--prompt-format", "bytes"])
    assert cp.returncode == 2 and "--prompt-format" in cp.stderr and "'bytes'" in cp.stderr, cp.stderr


def _sgl_cost() -> engine.CostModel:
    cfg = cli.parse(SGL, {})
    model = catalog.load_model(cfg.model_path)
    hw = catalog.load_hardware(cfg.sim.hardware, cfg.sim.hw_override)
    return scheduler.build_cost(cfg, model, hw, compute(cfg, model, hw))
