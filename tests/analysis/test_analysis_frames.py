"""pandas for analysts (issue 17): load_requests (one row per request) and load_summary (one row per
case and repetition), the README's notebook example, and pandas staying out of the CLI's way."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from qm_analysis_synth import ROOT, make_run

import analysis


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("frames"), reps=1)


def _bench(run: Path, rel: str) -> dict:
    return json.loads((run / rel / "bench.json").read_text())


def test_load_requests_one_row_per_request_with_workload_and_verdicts(run: Path) -> None:
    df = analysis.load_requests(run)
    expected = {
        "cases/short_c8/rep1": 40, "cases/short_c16/rep1": 40, "cases/foreign_sglang/rep1": 50,
        "mixed/rep1/control": 40, "mixed/rep1/decode_background": 40, "mixed/rep1/prefill_injection": 1,
    }  # fmt: skip
    assert len(df) == sum(expected.values())
    for col in (
        "case_id",
        "rep",
        "role",
        "isl",
        "osl",
        "concurrency",
        "status",
        "reliable",
        "ttft_ms",
        "e2e_ms",
    ):
        assert col in df.columns
    c8 = df[df.case_id == "short_c8"]
    assert set(c8.concurrency) == {8} and set(c8.isl) == {128} and set(c8.status) == {"completed"}
    recs = _bench(run, "cases/short_c8/rep1")["requests"]
    assert np.allclose(c8.sort_values("index").ttft_ms.to_numpy(), [r["ttft_ms"] for r in recs])
    assert list(c8.sort_values("index").queue_time_ms) == [r["queue_time_ms"] for r in recs]
    roles = df[df.suite == "mixed"].groupby("role", observed=True).size().to_dict()
    assert roles == {"control": 40, "decode_background": 40, "prefill_injection": 1}
    foreign = df[df.case_id == "foreign_sglang"]
    line = json.loads((run / "cases/foreign_sglang/rep1/bench.json").read_text().splitlines()[-1])
    assert set(foreign.status) == {"unknown"} and set(foreign.source_format) == {"sglang"}
    assert np.allclose(foreign.ttft_ms.to_numpy(), np.array(line["ttfts"]) * 1000)


def test_failed_requests_are_rows_with_nan_latencies(tmp_path: Path) -> None:
    from qm_analysis_synth import loadgen_result, meta, write_json

    d = tmp_path / "r" / "cases" / "c" / "rep1"
    write_json(d / "meta.json", meta("c", 1, status="failed", error_type="BENCH_FAILED", reason="2 failed"))
    write_json(d / "bench.json", loadgen_result(n=40, n_failed=2))
    df = analysis.load_requests(tmp_path / "r")
    assert len(df) == 40 and (~df.success).sum() == 2
    assert df[~df.success].ttft_ms.isna().all() and set(df[~df.success].error_class) == {"http_status"}
    assert set(df.status) == {"failed"} and set(df.error_type) == {"BENCH_FAILED"}


def test_load_summary_is_summary_csv(run: Path) -> None:
    from analysis.summarize import summarize

    summarize(run)
    with (run / "summary.csv").open() as fh:
        csv_rows = list(csv.DictReader(fh))
    df = analysis.load_summary(run)
    assert len(df) == len(csv_rows)
    assert list(df.case_id) == [r["case_id"] for r in csv_rows]
    assert list(df.status) == [r["status"] for r in csv_rows]
    assert np.allclose(df.ttft_p95_ms.to_numpy(dtype=float), [float(r["ttft_p95_ms"]) for r in csv_rows])
    assert str(df.concurrency.dtype) == "Int64"


def test_readme_notebook_example_runs(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "analysis" / "README.md").read_text()
    section = text[text.index("## pandas for analysts") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'load_requests("results/20261202-run")' in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    scope: dict = {}
    exec(code.replace("results/20261202-run", str(run)), scope)
    assert (tmp_path / "ttft_vs_concurrency.png").read_bytes()[:4] == b"\x89PNG"
    assert list(scope["ttft_p95"].index) == [8, 16]  # the two fixed cases' concurrency


@pytest.mark.parametrize(
    "argv",
    [["import analysis"], ["summarize"], ["case-done"]],
    ids=["import", "summarize", "case-done"],
)
def test_pandas_is_not_imported_by_the_cli_or_the_package(run: Path, argv: list[str]) -> None:
    if argv == ["import analysis"]:
        body = "import analysis\n"
    else:
        target = run if argv[0] == "summarize" else run / "cases" / "short_c8" / "rep1"
        body = (
            "import runpy\n"
            f"sys.argv = ['analysis', {argv[0]!r}, {str(target)!r}]\n"
            "try:\n    runpy.run_module('analysis', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
        )
    code = "import sys\n" + body + "print('pandas' in sys.modules)\n"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip().splitlines()[-1] == "False", res.stderr
