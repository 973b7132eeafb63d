"""loadgen beside the reference client (issue 15 item 4): the real clients' files, read and compared.

The reference files are the real SGLang bench_serving output and the vLLM bench serve files of
tests/analysis/fixtures (README there); loadgen's side is synthetic. Nothing here invents a figure
for a client: a client without a valid file gets a sentence, never a column.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qm_analysis_synth import FIXTURES, loadgen_result, make_run, meta, write_json

from analysis import crosscheck
from analysis.summarize import summarize
from module_utils import emulation_verdict
from tests.enginesim.es_prom import ZERO, scrape

SGLANG = FIXTURES / "sglang-0.5.23_c32_details.jsonl"  # 96 prompts, 64 out, C=32
VLLM = FIXTURES / "vllm-bench-serve_constructed_detailed.json"  # 8 prompts, one failed


def _case(root: Path, case: str = "c32", n: int = 96, osl: int = 64) -> Path:
    d = root / "cases" / case / "rep1"
    write_json(d / "meta.json", meta(case, 1, num_prompts=n, osl=osl, concurrency=32))
    write_json(d / "bench.json", loadgen_result(n=n, osl=osl, conc=32))
    return d


def test_both_clients_side_by_side_with_the_differing_columns_marked(tmp_path: Path) -> None:
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    comp = crosscheck.compare_case(d, meta("c32", 1, num_prompts=96, osl=64))
    assert comp is not None and comp["loadgen"]["ok"] and comp["reference"]["sglang"]["ok"]
    lines = crosscheck.section([comp])
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == "| figure | loadgen | sglang | comparable |"
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in table[1:]}
    # SGLang's TTFT is taken before a fresh connection: printed, marked not comparable.
    assert rows["TTFT mean ms"][3].startswith("not comparable (≈")
    assert rows["TPOT mean ms"][3] == "yes |"
    # The figures are the ones SGLang wrote (its mean TPOT), not recomputed from loadgen's.
    sgl = crosscheck.read_bench(SGLANG)
    assert rows["TPOT mean ms"][2] == f"{sgl.stats['tpot_mean_ms']:.2f}"
    lg = crosscheck.read_bench(d / "bench.json")
    assert rows["TPOT mean ms"][1] == f"{lg.stats['tpot_mean_ms']:.2f}"


def test_a_reference_run_that_failed_the_case_rules_gets_no_column(tmp_path: Path) -> None:
    d = _case(tmp_path, n=8, osl=16)
    shutil.copy(VLLM, d / "bench_vllm.json")  # 7 of 8 completed
    comp = crosscheck.compare_case(d, meta("c32", 1, num_prompts=8, osl=16))
    assert comp is not None and not comp["reference"]["vllm"]["ok"]
    text = "\n".join(crosscheck.section([comp]))
    assert "Only loadgen has figures: vllm" in text
    assert "| figure |" not in text


def test_a_reference_client_that_wrote_nothing_is_named_with_its_exit_code(tmp_path: Path) -> None:
    d = _case(tmp_path)
    (d / "bench_sglang.log").write_text("ModuleNotFoundError: No module named 'sglang'\n")
    (d / "bench_sglang.rc").write_text("1\n")
    comp = crosscheck.compare_case(d, meta("c32", 1, num_prompts=96, osl=64))
    text = "\n".join(crosscheck.section([comp]))
    assert "sglang ran (exit 1, see bench_sglang.log) but wrote no bench_sglang.jsonl" in text


def test_no_reference_run_no_section(tmp_path: Path) -> None:
    assert crosscheck.compare_case(_case(tmp_path), meta("c32", 1)) is None


def test_report_puts_both_side_by_side_and_names_the_loadgen_only_cases(tmp_path: Path) -> None:
    run = make_run(tmp_path, reps=1)
    d = run / "cases" / "c32" / "rep1"
    write_json(d / "meta.json", meta("c32", 1, num_prompts=96, osl=64, concurrency=32))
    write_json(d / "bench.json", loadgen_result(n=96, osl=64, conc=32))
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    summarize(run)
    report = (run / "report.md").read_text()
    assert "## Reference client side by side" in report
    assert "### c32 rep1: loadgen vs sglang" in report
    assert "Only loadgen ran (no reference client) in: " in report and "short_c8 rep1" in report
    # The client table under Metric definitions now has SGLang's column.
    footer = report.split("## Metric definitions", 1)[1]
    assert "| column | our definition | loadgen | sglang |" in footer
    # The reference file is not a case of its own: the summary rows are loadgen's.
    assert "bench_sglang" not in (run / "summary.csv").read_text()


# Each client's own /metrics window (issue 15 item 4): the emulator's verdict on it decides what stands.
def _window(d: Path, client: str, after: str, prompt: tuple[int, int] | None = None) -> None:
    """Scrapes around one client's run; ``prompt`` = (prefill tokens, requests) the server counted."""
    suffix = f"_{client}" if client else ""
    before = ZERO + _engine_counters(0, 0)
    after += _engine_counters(*prompt) if prompt else _engine_counters(0, 0)
    (d / f"metrics_before{suffix}.prom").write_text(before)
    (d / f"metrics_after{suffix}.prom").write_text(after)


def _engine_counters(prompt_tokens: int, requests: int) -> str:
    return (
        "# HELP sglang:prompt_tokens_total x\n# TYPE sglang:prompt_tokens_total counter\n"
        f"sglang:prompt_tokens_total {float(prompt_tokens)}\n"
        "# HELP sglang:num_requests_total x\n# TYPE sglang:num_requests_total counter\n"
        f"sglang:num_requests_total {float(requests)}\n"
    )


OK = scrape(0.02, 100.0, 2.0, 1000)  # realtime factor 1.0
SATURATED = scrape(0.02, 100.0, 4.0, 1000)  # realtime factor 0.5: the emulator fell behind


def _rows(d: Path) -> dict[str, list[str]]:
    comp = crosscheck.compare_case(d, meta("c32", 1, num_prompts=96, osl=64))
    lines = crosscheck.section([comp])
    return {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}


def test_each_client_gets_the_emulators_verdict_on_its_own_window(tmp_path: Path) -> None:
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    _window(d, "", OK)
    _window(d, "sglang", SATURATED)
    rows = _rows(d)
    assert rows["emulator verdict"][1].startswith("ok (realtime factor 1.000")
    assert rows["emulator verdict"][2].startswith("saturated (realtime factor 0.500")
    # what a TPOT from a saturated window measures: the emulator's own loop, wall per step
    assert rows["emulator busy wall ms/step"][1:3] == ["2.000", "4.000"]
    # TPOT has the same definition in both clients, but SGLang's window was saturated: never a "yes",
    # so no difference between the two columns reads as a disagreement of the clients.
    assert rows["TPOT mean ms"][3] == "not comparable (emulator: sglang window saturated) |"
    assert rows["ITL p99 ms"][3] == "not comparable (emulator: sglang window saturated) |"
    # The figures are still printed, each client's own.
    sgl = crosscheck.read_bench(SGLANG)
    assert rows["TPOT mean ms"][2] == f"{sgl.stats['tpot_mean_ms']:.2f}"


def test_both_windows_ok_leave_same_definition_figures_comparable(tmp_path: Path) -> None:
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    _window(d, "", OK)
    _window(d, "sglang", OK)
    rows = _rows(d)
    assert rows["emulator verdict"][1].startswith("ok") and rows["emulator verdict"][2].startswith("ok")
    assert rows["TPOT mean ms"][3] == "yes |" and rows["ITL p99 ms"][3] == "yes |"


def test_a_degraded_window_blocks_only_what_its_verdict_does_not_vouch_for(tmp_path: Path) -> None:
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    late = scrape(0.02, 100.0, 2.0, 1000, late=50)  # 5 % late steps: the ITL tail is not the hardware's
    _window(d, "", late)
    _window(d, "sglang", OK)
    rows = _rows(d)
    assert rows["emulator verdict"][1].startswith("degraded")
    assert rows["TPOT mean ms"][3] == "yes |"
    blocked = "not comparable (emulator: loadgen window degraded (itl_tail not vouched for)) |"
    assert rows["ITL p99 ms"][3] == blocked


def test_a_missing_scrape_of_the_reference_window_is_unknown_not_comparable(tmp_path: Path) -> None:
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    _window(d, "", OK)
    (d / "metrics_after_sglang.prom").write_text(OK)  # its before-scrape failed
    rows = _rows(d)
    assert rows["emulator verdict"][2] == "unknown"
    assert rows["TPOT mean ms"][3] == "not comparable (emulator: sglang window unknown) |"


def test_each_clients_prompt_length_is_shown_and_a_different_one_is_not_comparable(tmp_path: Path) -> None:
    """SGLang's text prompts re-tokenized by the server: 1,024 planned ids arrived as 3,788 tokens."""
    d = _case(tmp_path)
    shutil.copy(SGLANG, d / "bench_sglang.jsonl")
    _window(d, "", OK, prompt=(128 * 97, 97))
    _window(d, "sglang", OK, prompt=(473 * 97, 97))
    rows = _rows(d)
    assert rows["prompt tokens/request (client)"][1:3] == ["128.00", "128.00"]  # both planned 128
    assert rows["prompt tokens/request (server)"][1:3] == ["128.00", "473.00"]  # what arrived
    assert rows["TPOT mean ms"][3] == (
        "not comparable (workload: the server counted 128 vs 473 prompt tokens/request) |"
    )
    # The same length at the server: comparable again.
    _window(d, "sglang", OK, prompt=(128 * 97, 97))
    assert _rows(d)["TPOT mean ms"][3] == "yes |"


def test_read_case_reads_the_named_clients_own_window(tmp_path: Path) -> None:
    _window(tmp_path, "", OK)
    _window(tmp_path, "sglang", SATURATED)
    assert emulation_verdict.read_case(str(tmp_path))["verdict"] == "ok"
    assert emulation_verdict.read_case(str(tmp_path), "sglang")["verdict"] == "saturated"
    assert emulation_verdict.read_case(str(tmp_path), "vllm") is None  # no scrapes: nothing to judge
