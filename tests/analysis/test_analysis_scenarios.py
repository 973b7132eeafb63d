"""validate-scenarios: the committed table, every rule, the filter, the JSON plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from qm_analysis_synth import ROOT

HEADER = "case_id\tstage\tisl\tosl\tconcurrency\tmultiplier\tminimum\twarmup\tnote\n"


def _tsv(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    p = tmp_path / "s.tsv"
    p.write_text(header + body)
    return p


def test_committed_table_is_valid_and_expands_num_prompts(cli) -> None:
    code, out, err = cli("validate-scenarios", ROOT / "scenarios" / "quick_map.tsv", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert len(plan) == 11
    by_id = {c["case_id"]: c for c in plan}
    # num_prompts = max(C x multiplier, minimum)
    assert by_id["short_decode_c32"]["num_prompts"] == 128
    assert by_id["cold_prefill_4k"]["num_prompts"] == 3
    assert by_id["short_decode_c256"]["num_prompts"] == 512
    keys = "case_id stage isl osl concurrency multiplier minimum warmup note num_prompts"
    assert set(plan[0]) == set(keys.split())


def test_table_output_and_case_filter_keeps_file_order(cli) -> None:
    tsv = ROOT / "scenarios" / "quick_map.tsv"
    code, out, _ = cli("validate-scenarios", tsv, "--case-ids", "short_decode_c1,cold_prefill_4k")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("cold_prefill_4k") and lines[2].startswith("short_decode_c1")
    assert "2 case(s)" in lines[-1]


@pytest.mark.parametrize(
    ("body", "header", "needle"),
    [
        ("a\tshort_decode\t1\t1\t1\t1\t1\t0\tn\n", HEADER.replace("note", "notes"), "line 1"),
        (
            "a\tshort_decode\tabc\t1\t1\t1\t1\t0\tn\n",
            HEADER,
            "line 2 field 'isl': got 'abc', expected an integer > 0",
        ),
        (
            "a\tshort_decode\t1\t0\t1\t1\t1\t0\tn\n",
            HEADER,
            "line 2 field 'osl': got 0, expected an integer > 0",
        ),
        (
            "a\tshort_decode\t1\t1\t1\t1\t1\t-1\tn\n",
            HEADER,
            "field 'warmup': got -1, expected an integer >= 0",
        ),
        (
            "a\tshort_decode\t1\t1\t1\t1\t1\t0\tn\na\tmixed\t1\t1\t1\t1\t1\t0\tn\n",
            HEADER,
            "line 3 field 'case_id'",
        ),
        ("a\twarp_speed\t1\t1\t1\t1\t1\t0\tn\n", HEADER, "field 'stage': got 'warp_speed'"),
        ("a\tshort_decode\t1\t1\t1\t1\t1\t0\n", HEADER, "line 2: has 8 tab-separated fields, expected 9"),
        ("", HEADER, "no cases"),
    ],
)
def test_bad_tables_exit_2_naming_file_line_field(
    cli, tmp_path: Path, body: str, header: str, needle: str
) -> None:
    p = _tsv(tmp_path, body, header)
    code, out, err = cli("validate-scenarios", p)
    assert code == 2
    assert out == ""
    assert str(p) in err and needle in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_case_id_is_rejected(cli) -> None:
    code, _, err = cli(
        "validate-scenarios", ROOT / "scenarios" / "quick_map.tsv", "--case-ids", "short_decode_c1,nope"
    )
    assert code == 2 and "unknown case id(s) nope" in err


def test_missing_file(cli, tmp_path: Path) -> None:
    code, _, err = cli("validate-scenarios", tmp_path / "missing.tsv")
    assert code == 2 and "missing.tsv: file not found" in err
