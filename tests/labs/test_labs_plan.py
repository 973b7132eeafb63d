"""analysis/labs/plan.py: the labs' configuration is validated and expanded before anything starts."""

from __future__ import annotations

import orjson
import pytest
from labs_helpers import DEFAULTS, LABS_VARS, config

from analysis.errors import InputError
from analysis.labs import judge, plan, plots
from analysis.labs.definitions import GOALS, LABS


def test_the_playbook_tags_the_role_defaults_and_the_analysis_name_the_same_labs() -> None:
    assert tuple(LABS_VARS["labs_all"]) == LABS
    assert set(DEFAULTS["labs_definitions"]) == set(LABS) == set(DEFAULTS["labs_workloads"]) == set(GOALS)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("lab", LABS)
def test_every_default_lab_plans_on_both_engines(lab: str, engine: str) -> None:
    p = plan.build(config(lab, engine))
    assert p["variants"], lab
    runs = [[(r["name"], _same_client(r["argv"])) for r in v["runs"]] for v in p["variants"]]
    # every variant gets exactly the same runs (prompts, seeds, sizes): nothing but the variable differs
    assert all(r == runs[0] for r in runs)
    for v in p["variants"]:
        for r in v["runs"]:
            assert r["rel"] == f"{v['name']}/runs/{r['name']}"
            assert r["argv"][:2] == ["/usr/bin/python3", "/runs/r1/bin/loadgen.pyz"]
            assert "--output-details" in r["argv"] and "--scrape-metrics" in r["argv"]
    for c in p["comparisons"]:
        assert c["differs"], c


def _same_client(argv: list[str]) -> list[str]:
    """A run's client command without where it is sent and whether the client flushes (pd_disagg: the
    P/D variant's client goes to the router, and its run script flushes both instances instead)."""
    out = [a for a in argv if a != "--flush-cache"]
    i = out.index("--base-url")
    return out[:i] + out[i + 2 :]


def test_pd_lab_sends_the_pd_client_to_the_router_and_the_baseline_to_its_instance() -> None:
    p = plan.build(config("pd_disagg"))
    base, pd = p["variants"]
    assert (base["name"], pd["name"], pd.get("pd"), base.get("pd")) == ("baseline", "pd", True, None)
    assert (base["engine_vars"]["engine_tp_size"], pd["engine_vars"]["engine_tp_size"]) == (2, 1)
    names = [r["name"] for r in pd["runs"]]
    assert names[:4] == ["short_in_short_out", "short_in_long_out", "long_in_short_out", "long_in_long_out"]
    assert names[4:] == ["prefix_miss", "prefix_warm", "prefix_hit"]
    for b, r in zip(base["runs"], pd["runs"], strict=True):
        assert r["argv"][r["argv"].index("--base-url") + 1] == "http://127.0.0.1:30300"
        assert b["argv"][b["argv"].index("--base-url") + 1] == "http://127.0.0.1:30000"
        assert "--flush-cache" not in r["argv"] and "--tokenizer" not in r["argv"] + b["argv"]
        assert r["flush_sides"] == ("--flush-cache" in b["argv"]) == (r["name"] != "prefix_hit")
    (c,) = p["comparisons"]
    assert set(c["differs"]) == {"pd", "engine_tp_size"}


def test_pd_lab_refuses_a_measure_url_on_one_instance() -> None:
    cfg = config("pd_disagg")
    cfg["pd"]["router_url"] = f"http://127.0.0.1:{cfg['pd']['prefill_port']}"
    with pytest.raises(InputError, match="prefill instance's port, not the router's"):
        plan.build(cfg)


@pytest.mark.parametrize(("key", "value"), [("long_isl", 64), ("long_osl", 0), ("num_prompts", "8")])
def test_pd_lab_refuses_bad_sizes(key: str, value) -> None:
    cfg = config("pd_disagg")
    cfg["workload"][key] = value
    with pytest.raises(InputError, match=key):
        plan.build(cfg)


def test_each_lab_runs_its_source_workload() -> None:
    kinds = {lab: [r["name"] for r in plan.build(config(lab))["variants"][0]["runs"]] for lab in LABS}
    assert kinds["eager_vs_graph"] == kinds["decode_sweep"] == ["c1", "c4", "c16"]
    assert kinds["prefill_sweep"] == ["isl256", "isl1024", "isl4096"]
    assert kinds["prefix_cache"] == ["identical_first", "identical_second", "chat_warm", "chat"]
    assert kinds["chunk_interference"] == ["probe", "rep1", "rep2", "rep3", "rep4", "rep5"]
    assert kinds["kv_pressure"] == ["fill", "crowd"]
    assert kinds["fp8_kv"] == []
    assert kinds["ngram_spec"] == [f"{k}_s{i}" for k in ("repetitive", "prose") for i in (1, 2, 3)]
    vllm_ngram = [r["name"] for r in plan.build(config("ngram_spec", "vllm"))["variants"][0]["runs"]]
    assert vllm_ngram[-1] == "throughput"


def test_prefix_lab_sends_the_identical_prompt_twice_and_flushes_only_before_the_first(tmp_path) -> None:
    p = plan.build(config("prefix_cache"))
    runs = {r["name"]: r for r in p["variants"][0]["runs"]}
    assert runs["identical_first"]["flush"] and not runs["identical_second"]["flush"]
    assert "--flush-cache" not in runs["identical_second"]["argv"]
    path = runs["identical_first"]["argv"][runs["identical_first"]["argv"].index("--dataset-path") + 1]
    assert (
        path == runs["identical_second"]["argv"][runs["identical_second"]["argv"].index("--dataset-path") + 1]
    )
    plan.write(p, tmp_path)
    line = orjson.loads((tmp_path / "datasets" / "identical.jsonl").read_bytes())
    assert len(line["prompt"]) == 2080 and all(isinstance(t, int) for t in line["prompt"])
    chat = [orjson.loads(x) for x in (tmp_path / "datasets" / "chat.jsonl").read_bytes().splitlines()]
    warm = orjson.loads((tmp_path / "datasets" / "chat_warm.jsonl").read_bytes())
    assert len(chat) == 9 and all(c["prompt"][:768] == warm["prompt"][:768] for c in chat)
    assert len({tuple(c["prompt"][768:]) for c in chat}) == 9  # distinct questions
    assert orjson.loads((tmp_path / "plan.json").read_bytes())["schema"] == plan.PLAN_SCHEMA


def test_chunk_lab_rates_its_injections_from_the_probe() -> None:
    runs = plan.build(config("chunk_interference"))["variants"][0]["runs"]
    assert runs[0]["phase"] == 1 and runs[0]["rate_from"] is None and "--request-rate" in runs[0]["argv"]
    for r in runs[1:]:
        assert r["phase"] == 2 and r["rate_from"] == "probe" and "--request-rate" not in r["argv"]
        assert r["argv"][r["argv"].index("--arrival") + 1] == "constant" and "--flush-cache" in r["argv"]


def test_a_comparison_with_two_variables_is_refused_naming_them() -> None:
    cfg = config("chunk_interference")
    cfg["definition"]["comparisons"] = [
        {"baseline": "chunk8192", "treatment": "chunk512_mixed", "expect": "lower"}
    ]
    with pytest.raises(
        InputError, match=r"differ in \['--chunked-prefill-size', '--enable-mixed-chunk'\].*exactly one"
    ):
        plan.build(cfg)


def test_declared_multi_flag_variable_must_match_the_difference() -> None:
    cfg = config("eager_vs_graph")
    cfg["definition"]["variants"][1]["args"] = [
        "--cuda-graph-backend-decode",
        "disabled",
        "--cuda-graph-backend-prefill",
        "disabled",
    ]
    with pytest.raises(InputError, match="exactly one flag differs"):
        plan.build(cfg)
    cfg["definition"]["comparisons"][0]["flags"] = [
        "--cuda-graph-backend-decode",
        "--cuda-graph-backend-prefill",
    ]
    p = plan.build(cfg)
    assert set(p["comparisons"][0]["differs"]) == {
        "--cuda-graph-backend-decode",
        "--cuda-graph-backend-prefill",
    }
    cfg["definition"]["comparisons"][0]["flags"] = ["--cuda-graph-backend-decode"]
    with pytest.raises(InputError, match="not in the declared variable"):
        plan.build(cfg)


def test_variants_that_differ_in_engine_settings_are_not_one_variable() -> None:
    cfg = config("fp8_kv")
    cfg["definition"]["variants"][1]["engine"] = {"engine_context_length": 2048}
    with pytest.raises(InputError, match="differ in engine settings"):
        plan.build(cfg)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["definition"]["variants"][0].update(name="../x"), "names a directory"),
        (lambda c: c["definition"]["variants"].append(dict(c["definition"]["variants"][0])), "appears twice"),
        (lambda c: c["definition"]["variants"][0].update(args="--x"), "list of flag words"),
        (lambda c: c["definition"]["comparisons"][0].update(expect="faster"), "higher or lower"),
        (lambda c: c["definition"]["comparisons"][0].update(treatment="nope"), "two different variants"),
        (lambda c: c["workload"].update(concurrencies=[1, 0]), r"concurrencies: got 0"),
        (lambda c: c["workload"].update(osl="32"), r"osl: got '32'"),
        (lambda c: c["definition"]["variants"][0].update(engine={"engine_port": 1}), "expected keys among"),
    ],
)
def test_bad_configuration_is_refused_with_the_value_and_the_rule(mutate, message) -> None:
    cfg = config("eager_vs_graph")
    mutate(cfg)
    with pytest.raises(InputError, match=message):
        plan.build(cfg)


def test_injection_must_leave_the_stream_running() -> None:
    cfg = config("chunk_interference")
    cfg["workload"]["inject_after_events"] = 255
    with pytest.raises(InputError, match="inject_after_events"):
        plan.build(cfg)


def test_an_engine_without_a_definition_is_refused() -> None:
    with pytest.raises(InputError, match=r"labs_definitions\.fp8_kv\.sglang"):
        plan.build(config("fp8_kv", definition=None))


def test_the_judge_knows_which_labs_draw() -> None:
    assert set(judge.PLOTTED) == set(plots._DRAW)
