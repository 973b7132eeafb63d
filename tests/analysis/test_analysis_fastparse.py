"""The fast ``itls`` decoder (analysis/fastparse.py) against a full parse, so it can never
silently disagree: the real SGLang details file, edge cases of the array text, inputs it must
refuse, and documents where the cut could land in the wrong place."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import orjson
import pytest
from qm_analysis_synth import FIXTURES

from analysis.fastparse import PLACEHOLDER, Ragged, find_array, parse_document, parse_ragged
from analysis.rawload import Loaded, load_result, parse_json_bytes
from analysis.readers import FULL_DECODE_ENV, normalise, read_bench

DETAILS = FIXTURES / "sglang-0.5.23_c32_details.jsonl"
CHUNKS = (1, 2, 7, 64, 1 << 15)  # bytes of row text per orjson call: every chunk boundary case


def _same_rows(got: Ragged, want: list[list[float]]) -> None:
    """Bit-for-bit equal values (NaN equal to NaN, -0.0 distinct from 0.0) and equal row lengths."""
    assert got.lens.tolist() == [len(r) for r in want]
    flat = np.array([float(v) for r in want for v in r], dtype=np.float64)
    assert got.flat.dtype == np.float64 and got.flat.shape == flat.shape
    assert got.flat.tobytes() == flat.tobytes() or np.array_equal(got.flat, flat, equal_nan=True)
    assert np.array_equal(np.signbit(got.flat), np.signbit(flat))


def _doc(itls_text: str) -> bytes:
    """An SGLang-shaped line around a given ``itls`` text (json.dumps separators)."""
    return (
        '{"backend": "sglang", "request_rate": Infinity, "completed": 2, "server_info": null, '
        '"ttfts": [0.1, 0.2], "itls": ' + itls_text + ', "generated_texts": ["a ]", "b"], "errors": ["", ""]}'
    ).encode()


# ---------------------------------------------------------------- the real file


def test_real_sglang_details_equals_orjson_full_parse() -> None:
    data = DETAILS.read_bytes()
    want = parse_json_bytes(data)  # orjson over the whole line (head rewritten for Infinity)
    assert want == orjson.loads(data.replace(b"Infinity", b"null")) | {"request_rate": math.inf}
    got = parse_document(data)
    assert isinstance(got["itls"], Ragged), "the fast path must be taken on a real SGLang file"
    _same_rows(got["itls"], want["itls"])
    assert {k: v for k, v in got.items() if k != "itls"} == {k: v for k, v in want.items() if k != "itls"}
    start, stop = find_array(data)
    for chunk in CHUNKS:
        _same_rows(parse_ragged(data, start, stop, chunk), want["itls"])


def test_real_sglang_details_recomputed_stats_equal_both_ways(tmp_path: Path) -> None:
    """With the summary stripped every figure comes from the arrays: fast and plain decode agree."""
    raw = json.loads(DETAILS.read_text())
    stripped = {k: v for k, v in raw.items() if not k.startswith(("mean_", "median_", "std_", "p9"))}
    stripped["itls"][3] = []  # a request with a single output token
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(stripped) + "\n")
    fast = normalise(load_result(p, parse_document), want_requests=True)
    plain = normalise(load_result(p), want_requests=True)
    assert fast.sources["itl"] == "recomputed" and fast.per_request_arrays == "present"
    assert fast.stats == plain.stats
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name))


def test_read_bench_full_decode_takes_the_fast_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FULL_DECODE_ENV, "1")
    calls: list[int] = []
    import analysis.fastparse as fp

    real = fp.parse_ragged

    def spy(*args: object, **kw: object) -> Ragged | None:
        res = real(*args, **kw)  # type: ignore[arg-type]
        calls.append(res is not None)
        return res

    monkeypatch.setattr(fp, "parse_ragged", spy)
    d = read_bench(DETAILS)
    assert calls == [True] and d.per_request_arrays == "present"
    assert os.environ[FULL_DECODE_ENV] == "1"


# ---------------------------------------------------------------- edge cases of the array text

EDGE_CASES = {
    "no requests": "[]",
    "one empty row (1-token output)": "[[]]",
    "all rows empty": "[[], [], []]",
    "empty rows first, middle, last": "[[], [0.1], [], [0.2, 0.3], []]",
    "compact": "[[0.1,0.2],[],[3]]",
    "whitespace everywhere": "[ \n[ 0.1 ,\t0.2 ] ,\r\n [ ] ,[3]\t]",
    "whitespace-only row": "[[ ], [1]]",
    "pretty printed": json.dumps([[0.5, 1e-05], [], [2.5]], indent=2),
    "exponents and signs": "[[1e-05, 2E+3, -1.5e-7, 1E5, 0, -0.0, 0.0], [-3]]",
    "extremes": "[[1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, 4.9e-324, 1e-400]]",
    "integers": "[[1, 2], [3], [18446744073709551615, 18446744073709551616, -9223372036854775809]]",
    "Infinity and NaN": "[[Infinity, -Infinity, NaN], [0.1], []]",
    "NaN in a later row": "[[0.1, 0.2], [NaN]]",
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_cases_equal_the_stdlib_parse(name: str) -> None:
    text = EDGE_CASES[name]
    data = _doc(text)
    want = json.loads(data)  # the stdlib reads Infinity/NaN like SGLang's json.dumps wrote them
    if "Infinity" not in text and "NaN" not in text:
        as_floats = [[float(v) for v in r] for r in want["itls"]]  # big ints: orjson gives floats
        assert as_floats == [[float(v) for v in r] for r in orjson.loads(text)]
    got = parse_document(data)
    assert isinstance(got["itls"], Ragged), f"{name}: the fast path should take this"
    _same_rows(got["itls"], want["itls"])
    assert got["generated_texts"] == ["a ]", "b"] and got["request_rate"] == math.inf
    start, stop = find_array(data)
    assert data[start:stop].decode() == text
    for chunk in CHUNKS:
        _same_rows(parse_ragged(data, start, stop, chunk), want["itls"])


def test_random_repr_floats_bit_exact() -> None:
    """Shortest-repr doubles (up to 17 digits), ragged rows, many chunk boundaries."""
    rng = np.random.default_rng(7)
    rows = [
        list(rng.gamma(2.0, 0.01, int(n)) * 10.0 ** rng.integers(-8, 8)) for n in rng.integers(0, 40, 500)
    ]
    text = json.dumps(rows)
    data = _doc(text)
    start, stop = find_array(data)
    for chunk in (3, 100, 1 << 12, 1 << 15):
        got = parse_ragged(data, start, stop, chunk)
        _same_rows(got, rows)
        assert got.tolist() == rows


# ---------------------------------------------------------------- what it must refuse

NOT_JSON = [
    "[[1],]",
    "[,[1]]",
    "[[1] [2]]",
    "[[1],,[2]]",
    "[[1, 2,]]",
    "[[1 2]]",
    "[[1.]]",
    "[[.5]]",
    "[[01]]",
    "[[+1]]",
    "[[1e]]",
    "[[0x1A]]",
    "[[inf]]",
    "[[nan]]",
    "[[1], [2]",
    "[[1], [2]]]",
    "[[1] x, [2]]",
]


@pytest.mark.parametrize("text", NOT_JSON)
def test_invalid_array_text_is_refused(text: str) -> None:
    data = _doc(text)
    with pytest.raises(ValueError):
        json.loads(data)
    span = find_array(data)
    if span is not None:
        for chunk in CHUNKS:
            assert parse_ragged(data, *span, chunk) is None
    with pytest.raises(ValueError) as fast_err:
        parse_document(data)
    with pytest.raises(ValueError) as plain_err:
        parse_json_bytes(data)
    assert str(fast_err.value) == str(plain_err.value)  # same message, original positions


@pytest.mark.parametrize(
    "text", ["[[1, [2]]]", "[[true]]", "[[null, 1]]", "[[false]]", "[1, 2]", "[[1], 2]", "[[1e999]]"]
)
def test_valid_json_that_is_not_rows_of_numbers_goes_to_the_full_parse(text: str) -> None:
    data = _doc(text)
    span = find_array(data)
    assert span is None or parse_ragged(data, *span) is None
    assert parse_document(data) == parse_json_bytes(data) == json.loads(data)


@pytest.mark.parametrize(
    "doc",
    [
        b'{"server_info": {"itls": [[9]]}, "completed": 1, "itls": [[2]]}',
        b'{"note": "\\"itls\\": [[9]]", "completed": 1, "itls": [[2]]}',
        b'{"a\\"itls": [[9]], "completed": 1, "itls": [[2]]}',
        b'{"itls": [[9]], "completed": 1, "itls": [[2]]}',
        b'{"itls": [[9]], "completed": 1, "x": "' + PLACEHOLDER.encode() + b'"}',
        b'{"completed": 1, "itls": [[2]], "x": "' + PLACEHOLDER.encode() + b'"}',
        b'{"server_info": {"itls": [[9]]}, "completed": 1, "itls": "' + PLACEHOLDER.encode() + b'"}',
        b'{"itls": "not a list", "completed": 1}',
        b'{"completed": 1, "itls": [[2]]}\n{"completed": 2, "itls": [[3]]}',
        b'[{"itls": [[1]]}]',
    ],
)
def test_a_misplaced_cut_never_changes_the_result(doc: bytes) -> None:
    try:
        want = json.loads(doc)
    except ValueError:
        with pytest.raises(ValueError):
            parse_document(doc)
        return
    got = parse_document(doc)
    if isinstance(got, dict) and isinstance(got.get("itls"), Ragged):
        got = {**got, "itls": got["itls"].tolist()}
    assert got == want


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.7, 0.9, 0.999])
def test_truncated_real_file_fails_like_the_full_parse(frac: float) -> None:
    data = DETAILS.read_bytes()
    cut = data[: int(len(data) * frac)]
    with pytest.raises(ValueError) as fast_err:
        parse_document(cut)
    with pytest.raises(ValueError) as plain_err:
        parse_json_bytes(cut)
    assert str(fast_err.value) == str(plain_err.value)


def test_jsonl_with_two_runs_and_a_log_line(tmp_path: Path) -> None:
    line = DETAILS.read_bytes().strip()
    p = tmp_path / "bench.jsonl"
    p.write_bytes(line + b"\n" + line.replace(b'"completed": 96', b'"completed": 95') + b"\n")
    loaded = load_result(p, parse_document)
    assert loaded.layout == "jsonl" and loaded.runs_in_file == 2 and loaded.obj["completed"] == 95
    assert isinstance(loaded.obj["itls"], Ragged)
    log = tmp_path / "bench.log"
    log.write_bytes(b"[INFO] starting ] x\n" + line + b"\n[INFO] done ]\n")
    got = load_result(log, parse_document)
    assert got.layout == "log" and isinstance(got.obj["itls"], Ragged)
    _same_rows(got.obj["itls"], json.loads(line)["itls"])


def test_plain_decode_reads_nonfinite_itls_too(tmp_path: Path) -> None:
    """The full parse leaves Infinity/NaN inside lists as sentinel strings; both decoders agree."""
    rows = [[0.01] * 30 for _ in range(3000)] + [[math.inf, 0.02], [math.nan]]  # > 64 KiB
    obj = {"completed": len(rows), "server_info": None, "ttfts": [0.1] * len(rows), "itls": rows,
           "output_lens": [31] * len(rows), "errors": [""] * len(rows)}  # fmt: skip
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(obj))
    fast = normalise(load_result(p, parse_document), want_requests=True)
    plain = normalise(Loaded(parse_json_bytes(p.read_bytes()), p, "json", 1, None), want_requests=True)
    assert fast.stats.keys() == plain.stats.keys()
    for k, v in fast.stats.items():
        assert v == plain.stats[k] or (math.isnan(v) and math.isnan(plain.stats[k])), k
    assert np.array_equal(fast.e2e_ms, plain.e2e_ms, equal_nan=True)
    assert fast.e2e_ms[-2] == math.inf and math.isnan(fast.e2e_ms[-1])


def test_summarize_outputs_identical_with_the_plain_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end, every figure recomputed from the arrays (summary stripped), 8 files so the two
    worker processes are used: the CSVs are byte-identical whichever decoder read the files."""
    import analysis.readers as readers
    from analysis.summarize import summarize

    raw = json.loads(DETAILS.read_text())
    stripped = {k: v for k, v in raw.items() if not k.startswith(("mean_", "median_", "std_", "p9"))}
    run = tmp_path / "run"
    for i in range(8):
        rep = run / "cases" / f"c{i}" / "rep1"
        rep.mkdir(parents=True)
        stripped["itls"][i] = []  # a different 1-token request in each file
        (rep / "bench.json").write_text(json.dumps(stripped) + "\n")
    monkeypatch.setenv(FULL_DECODE_ENV, "1")
    outputs = {}
    for name, parse in (("fast", readers.parse_document), ("plain", parse_json_bytes)):
        monkeypatch.setattr(readers, "parse_document", parse)
        summarize(run)
        outputs[name] = {f: (run / f).read_bytes() for f in ("summary.csv", "summary.jsonl", "aggregate.csv")}
    assert outputs["fast"] == outputs["plain"]
    assert b"recomputed" in outputs["fast"]["summary.csv"]
