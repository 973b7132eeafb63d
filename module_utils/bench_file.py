# Copyright: quickmap contributors
# Apache-2.0
"""Read a benchmark client's result file: which client wrote it, and the facts a verdict needs.

The one reader of result formats for the whole project: the modules run it on the node (standard
library only, Python 3.8-compatible, shipped by AnsiballZ), and ``analysis`` imports the same file for
its format detection and case facts. The verdict itself lives in ``verdicts.py``. Formats (loadgen's
schema in analysis/README.md, the clients' files in docs/bench-clients.md), detected by keys, never by
file name:

- quickmap loadgen JSON (``schema: quickmap.loadgen/1``): ``completed``/``failed``/``complete`` and
  per-request ``requests[].output_tokens``;
- SGLang ``bench_serving`` JSONL (one object appended per run; ``output_lens`` with --output-details);
- vLLM ``bench serve`` JSON (``completed``/``failed``; ``output_lens`` with --save-detailed);
- guidellm ``benchmarks.json`` (``benchmarks[].metrics.request_totals``, per-request records);
- AIPerf ``profile_export_aiperf.json`` (one stats object per metric) and its per-request
  ``profile_export.jsonl`` (one record per line, read as one result);
- a console log in which one line is the JSON object (any of the first three).

Python's json accepts SGLang's ``Infinity`` request rate.
"""

from __future__ import annotations

import json
import math
import re

from .verdicts import judge_case

LOADGEN_SCHEMA_PREFIX = "quickmap.loadgen/"
FORMATS = ("loadgen", "sglang", "vllm", "guidellm", "aiperf", "aiperf_records")
_SGLANG_KEYS = (
    "total_output_tokens_retokenized",
    "server_info",
    "tag",
    "mean_e2e_latency_ms",
    "accept_length",
)
_VLLM_KEYS = (
    "total_token_throughput",
    "endpoint_type",
    "model_id",
    "mean_e2el_ms",
    "request_goodput",
    "request_goodput:",
    "latencies",
    "tokenizer_id",
)
# Measured top-level values of the flat formats (loadgen, SGLang, vLLM); a NaN or Infinity in one of
# them, or in a latency statistic (``{stat}_{metric}_ms``), fails the case. ``request_rate`` is a
# setting (SGLang writes Infinity for "all at once"), not a measurement.
_MEASURED = (
    "duration",
    "benchmark_duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "total_token_throughput",
)
_STAT_KEY = re.compile(r"(mean|median|std|p[0-9]+(\.[0-9]+)?)_[a-z0-9_]+_ms")
_PER_REQUEST_ARRAYS = ("ttfts", "latencies", "itls")
# The statistics SGLang writes for each latency. With all of them in the file, its per-request arrays
# are not judged (nor decoded by analysis's fast path): SGLang computed the statistics from them, so a
# NaN or Infinity there shows in the statistic.
SGLANG_SUMMARY_STATS = ("mean", "median", "std", "p90", "p95", "p99")
SGLANG_SUMMARY_METRICS = ("ttft", "tpot", "itl", "e2e_latency")
_LOADGEN_RECORD_MS = ("ttft_ms", "e2e_ms", "tpot_ms")
_GUIDELLM_RECORD = ("time_to_first_token_ms", "request_latency", "inter_token_latency_ms")
AIPERF_METRICS = (
    "time_to_first_token",
    "inter_token_latency",
    "request_latency",
    "inter_chunk_latency",
    "request_throughput",
    "output_token_throughput",
    "benchmark_duration",
)


class BenchFileError(Exception):
    """The file cannot be read as a result; ``reason`` is missing | empty | unparsable | truncated."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def detect_format(obj: object) -> str | None:
    """One of FORMATS, or None when the object is not a result we know.

    A line of AIPerf's per-request JSONL is ``aiperf_record`` (one request, not a result): the loaders
    gather such lines with :func:`gather_records` into one ``aiperf_records`` result.
    """
    if not isinstance(obj, dict):
        return None
    schema = obj.get("schema")
    if isinstance(schema, str) and schema.startswith(LOADGEN_SCHEMA_PREFIX):
        return "loadgen"
    if isinstance(obj.get("aiperf_records"), list):
        return "aiperf_records"
    if _guidellm_benchmark(obj) is not None:
        return "guidellm"
    if "aiperf_version" in obj or (
        isinstance(obj.get("request_latency"), dict) and isinstance(obj.get("time_to_first_token"), dict)
    ):
        return "aiperf"
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "metrics" in obj and "request_start_ns" in meta:
        return "aiperf_record"
    if "completed" not in obj:
        return None
    if any(k in obj for k in _VLLM_KEYS):
        return "vllm"
    if any(k in obj for k in _SGLANG_KEYS) or "mean_ttft_ms" in obj or "ttfts" in obj:
        return "sglang"
    return None


def gather_records(objs: list) -> dict | None:
    """AIPerf's per-request JSONL as one result object, or None when the lines are not such records."""
    if not objs or any(detect_format(o) != "aiperf_record" for o in objs):
        return None
    return {"aiperf_records": objs}


def _guidellm_benchmark(obj: dict, record: str = "last") -> dict | None:
    """The benchmark a guidellm report holds (the last, or first, when it ran several)."""
    benches = obj.get("benchmarks")
    if not isinstance(benches, list) or not benches:
        return None
    bench = benches[-1] if record == "last" else benches[0]
    metrics = bench.get("metrics") if isinstance(bench, dict) else None
    if not isinstance(metrics, dict) or not isinstance(metrics.get("request_totals"), dict):
        return None
    return bench


def _int(value: object) -> int | None:
    """A JSON count as int (accepts 3.0); None when absent or not a whole number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def load_result(path: str, record: str = "last") -> dict:
    """Find the result object in ``path``.

    Returns ``{"obj", "format", "layout": json|jsonl|log, "runs_in_file", "line"}``; ``record`` picks the
    ``last`` (newest, SGLang appends) or ``first`` object when a JSONL file holds several runs; in a
    log the first line that holds a result is taken (as ``analysis`` does).
    Raises BenchFileError naming what is wrong (missing, empty, truncated, unparsable).
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as exc:
        raise BenchFileError("missing", "missing file (the client wrote no result)") from exc
    except IsADirectoryError as exc:
        raise BenchFileError("unparsable", "is a directory, not a result file") from exc
    except OSError as exc:
        raise BenchFileError("missing", f"cannot read: {exc.strerror or exc}") from exc
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise BenchFileError("empty", f"empty file ({len(data)} bytes): the client wrote no result")

    whole_error: json.JSONDecodeError | None = None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        whole_error = exc
    else:
        fmt = detect_format(obj)
        if fmt is None:
            kind = type(obj).__name__ if not isinstance(obj, dict) else "object without 'completed'"
            raise BenchFileError("unparsable", f"JSON parses but is not a benchmark result ({kind})")
        if fmt == "aiperf_record":  # a per-request JSONL of one request
            obj, fmt = gather_records([obj]), "aiperf_records"
        runs = len(obj["benchmarks"]) if fmt == "guidellm" else 1
        return {"obj": obj, "format": fmt, "layout": "json", "runs_in_file": runs, "line": 1}

    found: list[tuple[int, dict, str]] = []
    last_bad: tuple[int, str] | None = None
    lines = text.splitlines()
    nonblank = [i for i, ln in enumerate(lines) if ln.strip()]
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped.startswith("{"):
            continue
        try:
            cand = json.loads(stripped)
        except json.JSONDecodeError as exc:
            last_bad = (number, exc.msg)
            continue
        fmt = detect_format(cand)
        if fmt is not None:
            found.append((number, cand, fmt))
    records = gather_records([obj for _, obj, _ in found]) if last_bad is None else None
    if records is not None and len(found) == len(nonblank):
        return {"obj": records, "format": "aiperf_records", "layout": "jsonl", "runs_in_file": 1, "line": 1}
    found = [f for f in found if f[2] != "aiperf_record"]
    if found:
        if last_bad is not None and last_bad[0] > found[-1][0] and last_bad[0] - 1 == nonblank[-1]:
            # SGLang appends one object per run: a cut-off last line is the newest run, not an older one.
            raise BenchFileError("truncated", f"truncated JSON on last line {last_bad[0]} ({last_bad[1]})")
        only_json = all(lines[i].strip().startswith("{") for i in nonblank)
        layout = "jsonl" if only_json else "log"
        # JSONL: one run per line, ``record`` picks. A log: its first result line, as analysis reads it.
        number, obj, fmt = found[-1] if record == "last" and layout == "jsonl" else found[0]
        return {"obj": obj, "format": fmt, "layout": layout, "runs_in_file": len(found), "line": number}

    stripped_text = text.strip()
    if whole_error is not None and stripped_text.startswith("{"):
        at_end = whole_error.pos >= len(text.rstrip()) - 1
        if at_end or not stripped_text.endswith("}"):
            raise BenchFileError(
                "truncated",
                f"truncated JSON (ends after {len(data)} bytes: {whole_error.msg} "
                f"at line {whole_error.lineno})",
            )
        raise BenchFileError(
            "unparsable",
            f"unparsable JSON ({whole_error.msg} at line {whole_error.lineno} col {whole_error.colno})",
        )
    if last_bad is not None and nonblank and last_bad[0] - 1 == nonblank[-1]:
        raise BenchFileError("truncated", f"truncated JSON on last line {last_bad[0]} ({last_bad[1]})")
    detail = f"; last JSON-looking line {last_bad[0]}: {last_bad[1]}" if last_bad else ""
    raise BenchFileError(
        "unparsable", f"no benchmark result JSON object found among {len(lines)} lines{detail}"
    )


def _numbers_finite(values: object) -> bool:
    """True when every number in a (nested) list is finite; None, bools and text are not numbers."""
    if isinstance(values, float):
        return math.isfinite(values)
    if isinstance(values, list):
        return all(_numbers_finite(v) for v in values)
    return True


def _stat(obj: dict, name: str, key: str = "avg") -> float | None:
    """AIPerf: ``obj[name][key]`` (its stats object per metric) as a number, else None."""
    block = obj.get(name)
    value = block.get(key) if isinstance(block, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def sglang_summary_complete(obj: dict) -> bool:
    """An SGLang result whose summary holds every latency statistic (numbers, finite or not)."""
    if "server_info" not in obj and "total_output_tokens_retokenized" not in obj:
        return False
    for stat in SGLANG_SUMMARY_STATS:
        for metric in SGLANG_SUMMARY_METRICS:
            value = obj.get(f"{stat}_{metric}_ms")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
    return True


def _whole_numbers(values: list) -> list:
    """Per-request token counts as ints (0 where not a whole number); the list itself when it already is."""
    if set(map(type, values)) == {int}:  # map/set run in C: 10,000 requests cost ~0.2 ms, not 2 ms
        return values
    return [_int(n) or 0 for n in values]


def _flat_facts(obj: dict, fmt: str, finite) -> dict:
    """loadgen, SGLang and vLLM: the counts are top-level keys, per-request data optional."""
    completed = _int(obj.get("completed"))
    failed = _int(obj.get("failed"))
    output_lens: list[int] | None = None
    bad = [k for k in _MEASURED if not _numbers_finite(obj.get(k))]
    bad += [k for k, v in obj.items() if _STAT_KEY.fullmatch(k) and not _numbers_finite(v)]
    if not (fmt == "sglang" and sglang_summary_complete(obj)):
        bad += [k for k in _PER_REQUEST_ARRAYS if obj.get(k) is not None and not finite(obj[k])]
    if fmt == "loadgen" and isinstance(obj.get("requests"), list):
        reqs = [r for r in obj["requests"] if isinstance(r, dict)]
        ok = [r for r in reqs if r.get("success")]
        if completed is None:
            completed = len(ok)
        if failed is None:
            failed = len(reqs) - len(ok)
        output_lens = [_int(r.get("output_tokens")) or 0 for r in ok]
        bad += [f"requests[].{k}" for k in _LOADGEN_RECORD_MS if not finite([r.get(k) for r in ok])]
    elif isinstance(obj.get("output_lens"), list):
        lens = _whole_numbers(obj["output_lens"])
        errors = obj.get("errors")
        if isinstance(errors, list) and len(errors) == len(lens):
            has_errors = any(errors)
            # no zip(strict=) before 3.10; a run without errors keeps the list as it is
            output_lens = [n for i, n in enumerate(lens) if not errors[i]] if has_errors else lens
            if failed is None:
                failed = sum(map(bool, errors)) if has_errors else 0
        elif completed is not None and completed == len(lens):
            output_lens = lens
    duration = obj.get("duration") if isinstance(obj.get("duration"), (int, float)) else None
    return {
        "completed": completed,
        "failed": failed,
        "num_prompts": _int(obj.get("num_prompts")),
        "duration": duration,
        "random_output_len": _int(obj.get("random_output_len")),
        "total_output_tokens": _int(obj.get("total_output_tokens")),
        "output_lens": output_lens,
        "nonfinite": bad,
    }


def _guidellm_facts(obj: dict, finite) -> dict:
    """guidellm: the last benchmark's totals; errored and incomplete (cut off) requests both failed."""
    bench = _guidellm_benchmark(obj) or {}
    totals = bench.get("metrics", {}).get("request_totals", {})
    recs = bench.get("requests", {}).get("successful") if isinstance(bench.get("requests"), dict) else None
    recs = [r for r in recs if isinstance(r, dict)] if isinstance(recs, list) else []
    completed = _int(totals.get("successful"))
    errored, incomplete = _int(totals.get("errored")), _int(totals.get("incomplete"))
    failed = None if errored is None or incomplete is None else errored + incomplete
    out_tokens = bench.get("metrics", {}).get("output_token_count")
    total = out_tokens.get("successful", {}).get("total_sum") if isinstance(out_tokens, dict) else None
    duration = bench.get("duration")
    bad = [] if _numbers_finite(duration) else ["benchmarks[].duration"]
    bad += [f"requests.successful[].{k}" for k in _GUIDELLM_RECORD if not finite([r.get(k) for r in recs])]
    lens = [_int(r.get("output_tokens")) or 0 for r in recs]
    return {
        "completed": completed,
        "failed": failed,
        "num_prompts": _int(totals.get("total")),
        "duration": duration if isinstance(duration, (int, float)) else None,
        "random_output_len": None,
        "total_output_tokens": _int(total),
        # guidellm may keep only a sample of the records (sample_size): then only the total can tell
        "output_lens": lens if completed is not None and len(lens) == completed else None,
        "nonfinite": bad,
    }


def _aiperf_facts(obj: dict) -> dict:
    """AIPerf's summary: one stats object per metric (``avg``, ``p50``, ...)."""
    completed = _int(_stat(obj, "completed_request_count"))
    if completed is None:
        completed = _int(_stat(obj, "request_count"))
    failed = _int(_stat(obj, "error_request_count"))
    errors = obj.get("error_summary")
    if failed is None and isinstance(errors, list):
        failed = sum(_int(e.get("count")) or 0 for e in errors if isinstance(e, dict))
    total = _stat(obj, "total_osl")
    if total is None:
        total = _stat(obj, "total_output_tokens")
    bad = []
    for name in AIPERF_METRICS:
        block = obj.get(name)
        if isinstance(block, dict) and not _numbers_finite(
            [v for v in block.values() if isinstance(v, float)]
        ):
            bad.append(name)
    return {
        "completed": completed,
        "failed": failed,
        "num_prompts": _int(_stat(obj, "request_count")),
        "duration": _stat(obj, "benchmark_duration"),
        "random_output_len": None,
        "total_output_tokens": _int(total),
        "output_lens": None,
        "nonfinite": bad,
    }


def aiperf_profiling(obj: dict) -> list:
    """The per-request records of AIPerf's profiling phase (warm-up records are not results)."""
    out = []
    for rec in obj.get("aiperf_records") or []:
        meta = rec.get("metadata") if isinstance(rec, dict) else None
        if isinstance(meta, dict) and meta.get("benchmark_phase", "profiling") == "profiling":
            out.append(rec)
    return out


def aiperf_value(rec: dict, name: str) -> object:
    """One metric of an AIPerf record, converted to ms for times (its ``unit`` says what it holds)."""
    metric = (rec.get("metrics") or {}).get(name)
    if not isinstance(metric, dict):
        return None
    value = metric.get("value")
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}.get(metric.get("unit"), 1.0)
    if isinstance(value, list):
        return [v * scale if isinstance(v, (int, float)) else v for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value * scale
    return value


def _aiperf_records_facts(obj: dict, finite) -> dict:
    """AIPerf's per-request JSONL: a record with an ``error`` failed; duration = last end - first start."""
    recs = aiperf_profiling(obj)
    ok = [r for r in recs if not r.get("error")]
    starts = [r["metadata"].get("request_start_ns") for r in recs]
    ends = [r["metadata"].get("request_end_ns") for r in recs]
    starts = [t for t in starts if isinstance(t, (int, float))]
    ends = [t for t in ends if isinstance(t, (int, float))]
    duration = (max(ends) - min(starts)) / 1e9 if starts and ends else None
    lens = [_int(aiperf_value(r, "output_sequence_length")) or 0 for r in ok]
    bad = []
    for name in ("time_to_first_token", "request_latency", "inter_token_latency", "inter_chunk_latency"):
        if not finite([aiperf_value(r, name) for r in ok]):
            bad.append(f"records[].{name}")
    return {
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "num_prompts": len(recs),
        "duration": duration,
        "random_output_len": None,
        "total_output_tokens": sum(lens),
        "output_lens": lens,
        "nonfinite": bad,
    }


def summarize(obj: dict, fmt: str, finite=None) -> dict:
    """The facts a verdict needs, whatever client wrote the object.

    ``output_lens`` holds the output tokens of each *successful* request when the file has them
    (loadgen always; SGLang --output-details / vLLM --save-detailed; guidellm and AIPerf records),
    else None. ``nonfinite`` names the measured values that are NaN or Infinity. ``finite(values)``
    says whether every number in a per-request array (list, or the caller's own array type) is
    finite; analysis passes a vectorised one, the default walks Python lists.
    """
    finite = finite or _numbers_finite
    if fmt == "guidellm":
        facts = _guidellm_facts(obj, finite)
    elif fmt == "aiperf":
        facts = _aiperf_facts(obj)
    elif fmt == "aiperf_records":
        facts = _aiperf_records_facts(obj, finite)
    else:
        facts = _flat_facts(obj, fmt, finite)
    complete_value = obj.get("complete")
    complete = complete_value if isinstance(complete_value, bool) else None
    if fmt == "loadgen":
        complete = complete_value is True  # loadgen always writes the flag: without it, not proven
    elif fmt == "aiperf":
        complete_value = {"was_cancelled": obj.get("was_cancelled"), "is_complete": obj.get("is_complete")}
        if obj.get("was_cancelled") is True or obj.get("is_complete") is False:
            complete = False
    reliable = obj.get("reliable") if isinstance(obj.get("reliable"), bool) else None
    errors_by_class = obj.get("errors_by_class") if isinstance(obj.get("errors_by_class"), dict) else None
    facts.update(
        format=fmt,
        complete=complete,
        complete_value=complete_value,
        reliable=reliable,
        errors_by_class=errors_by_class,
    )
    return facts


def output_stats(lens: list[int] | None) -> dict | None:
    """min / mean / max / total / count of per-request output tokens (None without per-request data)."""
    if not lens:
        return None
    return {
        "count": len(lens),
        "min": min(lens),
        "max": max(lens),
        "mean": round(sum(lens) / len(lens), 3),
        "total": sum(lens),
    }


def judge_file(
    path: str,
    expect_requests: int,
    expect_output_len: int | None = None,
    min_output_fraction: float = 1.0,
    record: str = "last",
) -> dict:
    """The verdict on one result file as a module result: ``passed``, one-line ``msg``, the counts.

    Shared by the ``bench_result`` module (validate a file) and ``bench_case`` (run a case, then
    validate what it wrote), so both judge a case by the same rules.
    """
    result: dict = {
        "changed": False,
        "passed": False,
        "path": path,
        "format": None,
        "reason": None,
        "output_check": "skipped",
        "short_outputs": 0,
    }
    try:
        loaded = load_result(path, record=record)
    except BenchFileError as exc:
        result.update(reason=exc.reason, msg=f"{path}: {exc}")
        return result
    summary = summarize(loaded["obj"], loaded["format"])
    verdict = judge_case(summary, expect_requests, expect_output_len, min_output_fraction)
    result.update(
        format=loaded["format"],
        layout=loaded["layout"],
        runs_in_file=loaded["runs_in_file"],
        line=loaded["line"],
        completed=summary["completed"],
        failed=summary["failed"],
        num_prompts=summary["num_prompts"],
        complete=summary["complete_value"] if loaded["format"] == "loadgen" else summary["complete"],
        reliable=summary["reliable"],
        duration=summary["duration"],
        errors_by_class=summary["errors_by_class"],
        total_output_tokens=summary["total_output_tokens"],
        output_tokens=output_stats(summary["output_lens"]),
        output_check=verdict["output_check"],
        short_outputs=verdict["short"],
        reason=verdict["reason"],
    )
    if verdict["problem"]:
        result["msg"] = f"{path}: {verdict['problem']}"
        return result
    osl = f", outputs reached OSL {expect_output_len}" if expect_output_len else ""
    result["passed"] = True
    result["msg"] = (
        f"{path}: {loaded['format']} result, completed {summary['completed']}/{expect_requests}{osl}"
    )
    return result
