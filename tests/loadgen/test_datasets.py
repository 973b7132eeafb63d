"""Datasets, range-ratio semantics and arrival schedules."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest
from fakeserver import FakeServer

from loadgen import arrivals, datasets, serverapi


@pytest.mark.parametrize(
    "sem,ratio,lo,hi",
    [
        ("sglang", 0.0, 1, 100),  # SGLang's default: uniform on [1, L]
        ("sglang", 0.5, 50, 100),
        ("sglang", 1.0, 100, 100),
        ("vllm", 0.0, 100, 100),  # vLLM's default: fixed L
        ("vllm", 0.5, 50, 150),
    ],
)
def test_range_ratio_semantics(sem, ratio, lo, hi):
    lens = datasets.sample_lens(100, ratio, sem, 4000, random.Random(1))
    assert min(lens) == lo and max(lens) == hi
    assert datasets.len_window(100, ratio, sem) == (lo, hi)
    if sem == "vllm" and ratio == 0.5:
        assert abs(statistics.fmean(lens) - 100) < 3  # symmetric window
    if sem == "sglang" and ratio == 0.0:
        assert abs(statistics.fmean(lens) - 50.5) < 3  # SGLang's default averages L/2


def test_range_ratio_end_to_end(lg):
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "30",
                "--random-input-len",
                "20",
                "--random-output-len",
                "10",
                "--random-range-ratio",
                "0.5",
                "--range-ratio-semantics",
                "vllm",
                "--warmup-requests",
                "0",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    ins = [r["input_tokens"] for r in res["requests"]]
    outs = [r["output_tokens"] for r in res["requests"]]
    assert min(ins) >= 10 and max(ins) <= 30 and len(set(ins)) > 3
    assert min(outs) >= 5 and max(outs) <= 15
    assert "Sampling input_len from [10, 30] and output_len from [5, 15]" in cp.stdout


def test_arrival_schedules_are_absolute_and_exact_on_average():
    for arr, b in (("poisson", 1.0), ("gamma", 0.3), ("constant", 1.0)):
        s = arrivals.schedule(2000, 50.0, arr, b, seed=5)
        assert s[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(s))
        assert abs(1999 / s[-1] - 50.0) < 1e-6
    g = arrivals.schedule(3000, 10.0, "gamma", 0.25, 1)
    gaps = [b - a for a, b in itertools.pairwise(g)]
    # burstiness 0.25: coefficient of variation 1/sqrt(0.25) = 2 (Poisson would be 1)
    assert 1.7 < statistics.pstdev(gaps) / statistics.fmean(gaps) < 2.3
    assert arrivals.schedule(5, None, "poisson", 1.0, 1) == [0.0] * 5


def test_text_prompts_checked_by_server_tokenizer(lg):
    # chat takes text only; --tokenizer server makes each prompt count exactly via /tokenize
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "vllm-chat",
                "--base-url",
                srv.url,
                "--num-prompts",
                "5",
                "--tokenizer",
                "server",
                "--random-input-len",
                "37",
                "--random-output-len",
                "4",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
            ]
        )
        bodies = [r["body"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    assert cp.returncode == 0, cp.stderr
    assert [len(b["messages"][0]["content"].split()) for b in bodies] == [37] * 5
    assert res["dataset_info"]["input_lens_checked"] is True
    assert res["prompt_format"] == "text"


def test_hf_tokenizer_text_prompts_exact(lg, tmp_path):
    # tokenizers is a dev dependency: the test must run (not skip) in CI; the tokenizer dir is
    # built here, in memory, so no network is needed
    import tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1}
    for i in range(500):
        vocab[f"w{i}x"] = i + 2
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>"])
    d = tmp_path / "tok"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    assert tokenizers.__version__
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                srv.url,
                "--num-prompts",
                "4",
                "--tokenizer",
                str(d),
                "--random-input-len",
                "25",
                "--random-output-len",
                "3",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
            ]
        )
        bodies = [r["body"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    assert cp.returncode == 0, cp.stderr
    for b in bodies:
        words = b["messages"][0]["content"].split()
        assert len(words) == 25 and "<s>" not in words and "[UNK]" not in words
    assert res["dataset_info"]["prompt_len_mismatch_tokens"] == 0


def test_shared_prefix_groups(lg):
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--dataset-name",
                "shared-prefix",
                "--gsp-num-groups",
                "3",
                "--gsp-prompts-per-group",
                "4",
                "--gsp-system-prompt-len",
                "50",
                "--gsp-question-len",
                "10",
                "--gsp-output-len",
                "6",
                "--warmup-requests",
                "0",
            ]
        )
        ids = [r["body"]["input_ids"] for r in srv.requests if r["path"] == "/generate"]
    assert cp.returncode == 0, cp.stderr
    assert res["num_prompts"] == 12 and res["completed"] == 12
    assert all(len(x) == 60 for x in ids)
    prefixes = {tuple(x[:50]) for x in ids}
    assert len(prefixes) == 3
    assert len({tuple(x[50:]) for x in ids}) == 12
    assert res["total_output_tokens"] == 72


def test_jsonl_prompts(lg, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "alpha beta gamma", "output_len": 3})
        + "\n\n"
        + json.dumps({"prompt": [5, 6, 7, 8, 9], "output_len": 2})
        + "\n"
    )
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "vllm",
                "--base-url",
                srv.url,
                "--dataset-name",
                "jsonl",
                "--dataset-path",
                str(f),
                "--num-prompts",
                "4",
                "--warmup-requests",
                "0",
            ]
        )
        prompts = [r["body"]["prompt"] for r in srv.requests if r["path"] == "/v1/completions"]
    assert cp.returncode == 0, cp.stderr
    assert sorted(map(str, prompts)) == sorted(map(str, ["alpha beta gamma", [5, 6, 7, 8, 9]] * 2))
    assert res["total_output_tokens"] == 10


def test_jsonl_bad_line_is_refused(lg, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    cp, res = lg(["--dataset-name", "jsonl", "--dataset-path", str(f), "--port", "1"], out=False)
    assert cp.returncode == 2 and f"{f}:2" in cp.stderr and res is None


def test_sharegpt(lg, tmp_path):
    f = tmp_path / "sg.json"
    conv = [
        {
            "conversations": [
                {"from": "human", "value": "tell me about rivers and seas"},
                {"from": "gpt", "value": "rivers flow into the sea slowly"},
            ]
        },
        {"conversations": [{"from": "human", "value": "hi"}]},  # no reply: skipped
        {
            "conversations": [
                {"from": "human", "value": "why is the sky blue today"},
                {"from": "gpt", "value": "light scatters in air"},
            ]
        },
    ]
    f.write_text(json.dumps(conv))
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                srv.url,
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                str(f),
                "--num-prompts",
                "4",
                "--warmup-requests",
                "0",
            ]
        )
        bodies = [r["body"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    assert cp.returncode == 0, cp.stderr
    contents = sorted(b["messages"][0]["content"] for b in bodies)
    assert set(contents) == {"tell me about rivers and seas", "why is the sky blue today"}
    # output budget = the reply's length (whitespace words without a tokenizer)
    assert sorted({b["max_completion_tokens"] for b in bodies}) == [4, 6]
    assert res["completed"] == 4


def test_prometheus_parser_and_deltas():
    text = (
        "# HELP x\n# TYPE sglang:prompt_tokens_total counter\n"
        'sglang:prompt_tokens_total{model_name="m",tp_rank="0"} 10\n'
        'sglang:prompt_tokens_total{model_name="m",tp_rank="1"} 5\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="a}b"} 7 1700000000\n'
        'sglang:ttft_seconds_bucket{le="0.1"} 3\nsglang:ttft_seconds_count 4\n'
        "sglang:num_running_reqs 2.0\n"
    )
    a = serverapi.parse_prometheus(text)
    assert a["sglang:prompt_tokens_total"] == 15 and a["vllm:prefix_cache_hits_total"] == 7
    assert "sglang:ttft_seconds_bucket" not in a and a["sglang:ttft_seconds_count"] == 4
    b = dict(a, **{"sglang:prompt_tokens_total": 40.0, "sglang:num_running_reqs": 9.0})
    d = serverapi.counter_deltas(a, b)
    assert d["sglang:prompt_tokens_total"] == 25 and "sglang:num_running_reqs" not in d


def test_hub_name_tokenizer_falls_back_to_server_tokenize(lg):
    # what the bench role passes by default (--tokenizer = the model path, here a hub-style name)
    with FakeServer() as srv:
        cp, _res = lg(
            [
                "--backend",
                "vllm-chat",
                "--base-url",
                srv.url,
                "--num-prompts",
                "3",
                "--tokenizer",
                "Qwen/Qwen3-0.6B",
                "--random-input-len",
                "12",
                "--random-output-len",
                "2",
                "--random-range-ratio",
                "1",
                "--warmup-requests",
                "0",
            ]
        )
        bodies = [r["body"] for r in srv.requests if r["path"] == "/v1/chat/completions"]
    assert cp.returncode == 0, cp.stderr
    assert "not a local directory" in cp.stderr and "/tokenize instead" in cp.stderr
    assert [len(b["messages"][0]["content"].split()) for b in bodies] == [12] * 3


def test_tokenizer_dir_without_tokenizer_json_falls_back(lg, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    with FakeServer() as srv:
        cp, res = lg(
            [
                "--backend",
                "sglang",
                "--base-url",
                srv.url,
                "--num-prompts",
                "2",
                "--tokenizer",
                str(d),
                "--random-input-len",
                "5",
                "--random-output-len",
                "2",
                "--random-range-ratio",
                "1",
            ]
        )
    assert cp.returncode == 0, cp.stderr
    assert "tokenizer.json" in cp.stderr and res["total_input_tokens"] == 10


def test_missing_tokenizer_path_is_refused(lg):
    cp, _res = lg(["--tokenizer", "/nonexistent/tok", "--port", "1", "--num-prompts", "1"], out=False)
    assert cp.returncode == 2 and "--tokenizer '/nonexistent/tok': no such directory" in cp.stderr


@pytest.mark.parametrize(
    "cap,cpus,expected",
    [(1024, 2, 1), (256, 2, 1), (1024, 8, 7), (256, 8, 2), (64, 8, 1), (None, 16, 8), (4096, 1, 1)],
)
def test_auto_workers_leave_a_cpu_to_the_server(cap, cpus, expected):
    """One worker per 128 streams, never more than the usable CPUs minus one (the server's share)."""
    from loadgen.cli import auto_workers

    assert auto_workers(cap, 1000, cpus=cpus) == expected
