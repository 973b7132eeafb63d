# Copyright: quickmap contributors
# Apache-2.0
"""Read a benchmark client's result file and check it against what the case asked for (stdlib only).

Modules cannot import the ``analysis`` package (they run on the node, shipped by AnsiballZ), so this is
a small, self-contained reader for the formats quickmap meets (shared/brief/contracts.md §3 and
shared/reference/bench-clients.md §3):

- quickmap loadgen JSON (``schema: quickmap.loadgen/1``): ``completed``/``failed``/``complete`` and
  per-request ``requests[].output_tokens``;
- SGLang ``bench_serving`` JSONL (one object appended per run; ``output_lens`` with --output-details);
- vLLM ``bench serve`` JSON (``completed``/``failed``; ``output_lens`` with --save-detailed);
- a console log in which one line is the JSON object (any of the above).

Detection is by keys, never by file name. Python's json accepts SGLang's ``Infinity`` request rate.
"""

from __future__ import annotations

import json
import math

LOADGEN_SCHEMA_PREFIX = "quickmap.loadgen/"
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


class BenchFileError(Exception):
    """The file cannot be read as a result; ``reason`` is missing | empty | unparsable | truncated."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def detect_format(obj: object) -> str | None:
    """ "loadgen", "sglang", "vllm", or None when the object is not a result we know."""
    if not isinstance(obj, dict):
        return None
    schema = obj.get("schema")
    if isinstance(schema, str) and schema.startswith(LOADGEN_SCHEMA_PREFIX):
        return "loadgen"
    if "completed" not in obj:
        return None
    if any(k in obj for k in _VLLM_KEYS):
        return "vllm"
    if any(k in obj for k in _SGLANG_KEYS) or "mean_ttft_ms" in obj or "ttfts" in obj:
        return "sglang"
    return None


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
    ``last`` (newest, SGLang appends) or ``first`` object when a file holds several runs.
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
    except RecursionError as exc:  # an array/object bomb: name it instead of crashing the module
        raise BenchFileError("unparsable", "JSON nested deeper than the parser's recursion limit") from exc
    else:
        fmt = detect_format(obj)
        if fmt is None:
            kind = type(obj).__name__ if not isinstance(obj, dict) else "object without 'completed'"
            raise BenchFileError("unparsable", f"JSON parses but is not a benchmark result ({kind})")
        return {"obj": obj, "format": fmt, "layout": "json", "runs_in_file": 1, "line": 1}

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
        except RecursionError:
            last_bad = (number, "JSON nested deeper than the parser's recursion limit")
            continue
        fmt = detect_format(cand)
        if fmt is not None:
            found.append((number, cand, fmt))
    if found:
        if last_bad is not None and last_bad[0] > found[-1][0] and last_bad[0] - 1 == nonblank[-1]:
            # SGLang appends one object per run: a cut-off last line is the newest run, not an older one.
            raise BenchFileError("truncated", f"truncated JSON on last line {last_bad[0]} ({last_bad[1]})")
        number, obj, fmt = found[-1] if record == "last" else found[0]
        only_json = all(lines[i].strip().startswith("{") for i in nonblank)
        layout = "jsonl" if only_json else "log"
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


def summarize(obj: dict, fmt: str) -> dict:
    """The counts a check needs, whatever client wrote the object.

    ``output_lens`` holds the output tokens of each *successful* request when the file has them
    (loadgen always; SGLang --output-details / vLLM --save-detailed), else None.
    """
    completed = _int(obj.get("completed"))
    failed = _int(obj.get("failed"))
    output_lens: list[int] | None = None
    if fmt == "loadgen" and isinstance(obj.get("requests"), list):
        reqs = [r for r in obj["requests"] if isinstance(r, dict)]
        ok = [r for r in reqs if r.get("success")]
        if completed is None:
            completed = len(ok)
        if failed is None:
            failed = len(reqs) - len(ok)
        output_lens = [_int(r.get("output_tokens")) or 0 for r in ok]
    elif isinstance(obj.get("output_lens"), list):
        lens = [_int(n) or 0 for n in obj["output_lens"]]
        errors = obj.get("errors")
        if isinstance(errors, list) and len(errors) == len(lens):
            output_lens = [n for i, n in enumerate(lens) if not errors[i]]  # no zip(strict=) before 3.10
            if failed is None:
                failed = sum(1 for err in errors if err)
        elif completed is not None and completed == len(lens):
            output_lens = lens
    num_prompts = _int(obj.get("num_prompts"))
    complete = obj.get("complete") if isinstance(obj.get("complete"), bool) else None
    reliable = obj.get("reliable") if isinstance(obj.get("reliable"), bool) else None
    errors_by_class = obj.get("errors_by_class") if isinstance(obj.get("errors_by_class"), dict) else None
    duration = obj.get("duration") if isinstance(obj.get("duration"), (int, float)) else None
    return {
        "completed": completed,
        "failed": failed,
        "num_prompts": num_prompts,
        "complete": complete,
        "reliable": reliable,
        "errors_by_class": errors_by_class,
        "duration": duration,
        "random_output_len": _int(obj.get("random_output_len")),
        "total_output_tokens": _int(obj.get("total_output_tokens")),
        "output_lens": output_lens,
    }


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


def check(
    summary: dict,
    expect_requests: int,
    expect_output_len: int | None = None,
    min_output_fraction: float = 1.0,
) -> dict:
    """Judge a summary: ``{"reason": None | class, "problem": one line | None, "output_check", "short"}``.

    Reasons: ``incomplete`` (loadgen complete=false), ``count`` (completed != expected),
    ``short_output`` (fewer than ``min_output_fraction`` of completed requests reached the OSL).
    Without per-request lengths the OSL check falls back to total_output_tokens >= fraction *
    completed * OSL ("aggregate"); without either it fails closed (it cannot prove the OSL).
    """
    out: dict = {"reason": None, "problem": None, "output_check": "skipped", "short": 0}
    completed = summary["completed"]
    if summary["complete"] is False:
        out["reason"] = "incomplete"
        out["problem"] = (
            f"run did not complete (complete=false: interrupted or truncated; completed {completed}, "
            f"failed {summary['failed']})"
        )
        return out
    if completed is None:
        out["reason"] = "count"
        out["problem"] = "no 'completed' count in the result"
        return out
    if completed != expect_requests:
        extra = f", failed {summary['failed']}" if summary["failed"] is not None else ""
        if summary["errors_by_class"]:
            extra += f", errors_by_class {json.dumps(summary['errors_by_class'], sort_keys=True)}"
        out["reason"] = "count"
        out["problem"] = (
            f"completed {completed} != expected {expect_requests} requests{extra} "
            "(rule: every request of the case must complete)"
        )
        return out
    if expect_output_len is None:
        return out
    lens = summary["output_lens"]
    if lens is not None:
        out["output_check"] = "per_request"
        short = [n for n in lens if n < expect_output_len]
        out["short"] = len(short)
        reached = (len(lens) - len(short)) / len(lens) if lens else 0.0
        if not lens or reached < min_output_fraction:
            out["reason"] = "short_output"
            out["problem"] = (
                f"{len(short)} of {len(lens)} completed requests have fewer than {expect_output_len} "
                f"output tokens (min {min(lens) if lens else 0}; "
                f"rule: at least {min_output_fraction:g} of them reach the OSL)"
            )
        return out
    total = summary["total_output_tokens"]
    if total is None:
        out["reason"] = "short_output"
        out["problem"] = (
            "cannot verify output lengths: no per-request output_lens and no total_output_tokens "
            "in the result"
        )
        return out
    out["output_check"] = "aggregate"
    need = min_output_fraction * completed * expect_output_len
    if total < need:
        out["reason"] = "short_output"
        out["problem"] = (
            f"total_output_tokens {total} < {need:g} = {min_output_fraction:g} x {completed} requests x OSL "
            f"{expect_output_len} (outputs stopped before the OSL; is ignore_eos off?)"
        )
    return out


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
    verdict = check(summary, expect_requests, expect_output_len, min_output_fraction)
    result.update(
        format=loaded["format"],
        layout=loaded["layout"],
        runs_in_file=loaded["runs_in_file"],
        line=loaded["line"],
        completed=summary["completed"],
        failed=summary["failed"],
        num_prompts=summary["num_prompts"],
        complete=summary["complete"],
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
