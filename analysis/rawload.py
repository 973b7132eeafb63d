"""Find the benchmark result object in a file, whatever client wrote it (no numpy here).

Accepted layouts (see README "Readers"):
- one JSON document (quickmap loadgen, vLLM ``--save-result``; may be pretty-printed);
- JSONL, one object per line (SGLang appends one line per run; vLLM ``--append-result``):
  the **last** object is the latest run, and ``runs_in_file`` says how many there were;
- a log where the JSON object is one line among others: the first line that parses as a result.

SGLang writes ``json.dumps`` output, so ``request_rate: inf`` appears as the non-standard token
``Infinity``. orjson rejects it; we rewrite only tokens that sit in value position into sentinel
strings and map them back. A rewrite that lands inside a string breaks that string, so it can only
turn a valid document into a parse error (then we fall back to the stdlib parser), never into a
wrong value.
"""

from __future__ import annotations

import json
import math
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError
from module_utils.bench_file import detect_format, gather_records, sglang_summary_complete

_SENTINELS = {
    "__qm_Infinity__": math.inf,
    "__qm_-Infinity__": -math.inf,
    "__qm_NaN__": math.nan,
}
_VALUE_BEFORE = b":[,"
_VALUE_AFTER = b",]}"
_WS = b" \t\r\n"


class Loaded:
    """A parsed result object plus where it came from (for messages and the report).

    A plain class, not a dataclass: importing dataclasses costs ~10 ms of every role call.
    """

    __slots__ = ("layout", "line", "obj", "path", "runs_in_file")

    def __init__(
        self, obj: dict[str, Any], path: Path, layout: str, runs_in_file: int, line: int | None
    ) -> None:
        self.obj = obj
        self.path = path
        self.layout = layout  # "json" | "jsonl" | "log"
        self.runs_in_file = runs_in_file
        self.line = line  # 1-based line of the object for jsonl/log


def _sanitize_nonfinite(data: bytes) -> bytes | None:
    """Rewrite bare Infinity/-Infinity/NaN in value position into sentinel strings.

    Each token's next position is cached, so the whole buffer is scanned about once per token
    kind (the files can be hundreds of MB).
    """
    n = len(data)
    nxt = {b"Infinity": data.find(b"Infinity"), b"NaN": data.find(b"NaN")}
    if nxt[b"Infinity"] < 0 and nxt[b"NaN"] < 0:
        return None
    out: list[bytes] = []
    pos = 0
    changed = False
    while True:
        live = [(j, tok) for tok, j in nxt.items() if j >= 0]
        if not live:
            break
        j, tok = min(live)
        m = j + len(tok)
        start = j - 1 if tok == b"Infinity" and j > 0 and data[j - 1] == 0x2D else j  # 0x2D = "-"
        k = start - 1
        while k >= 0 and data[k] in _WS:
            k -= 1
        e = m
        while e < n and data[e] in _WS:
            e += 1
        if k >= 0 and data[k] in _VALUE_BEFORE and e < n and data[e] in _VALUE_AFTER:
            out.append(data[pos:start])
            out.append(b'"__qm_' + data[start:m] + b'__"')
            pos = m
            changed = True
        nxt[tok] = data.find(tok, m)
    if not changed:
        return None
    out.append(data[pos:])
    return b"".join(out)


def nonfinite_value(value: Any) -> Any:
    """The float for a sentinel string left inside a list by the rewrite, else ``value``.

    ``_restore`` does not walk big lists (that would be a Python loop per request); readers call
    this only when a per-request array failed to convert to floats.
    """
    return _SENTINELS.get(value, value) if isinstance(value, str) else value


def all_finite(values: Any) -> bool:
    """True when every number in ``values`` is finite: a (nested) list, or an array object with its own
    ``all_finite()`` (``fastparse.Ragged``). The sentinel strings of Infinity/NaN count as non-finite;
    None, bools and other text are not numbers and pass. The judge's ``finite`` for callers without
    numpy (the state subcommands)."""
    check = getattr(values, "all_finite", None)
    if check is not None:
        return bool(check())
    if isinstance(values, float):
        return math.isfinite(values)
    if isinstance(values, str):
        return values not in _SENTINELS
    if isinstance(values, list):
        return all(map(all_finite, values))
    return True


def _restore(obj: Any) -> Any:
    """Map sentinel strings back to floats in top-level and nested dict values (not big lists)."""
    if isinstance(obj, dict):
        for key, val in obj.items():
            if isinstance(val, str) and val in _SENTINELS:
                obj[key] = _SENTINELS[val]
            elif isinstance(val, dict):
                _restore(val)
    return obj


_HEAD = 1 << 16


def parse_json_bytes(data: bytes) -> Any:
    """Parse one JSON document, tolerating Python's Infinity/NaN tokens. Raises ValueError.

    First try: rewrite non-finite tokens in the first 64 KiB only (where SGLang's summary and its
    ``request_rate: Infinity`` live) and parse; scanning a multi-MB file for tokens costs more than
    parsing it. If that fails, the whole buffer is rewritten, then the stdlib parser is the last resort.
    """
    if len(data) > _HEAD:
        head = _sanitize_nonfinite(data[:_HEAD])
        try:
            return _restore(orjson.loads(head + data[_HEAD:])) if head is not None else orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    fixed = _sanitize_nonfinite(data)
    if fixed is not None:  # sanitise first: a failed orjson pass over a big file costs real time
        try:
            return _restore(orjson.loads(fixed))
        except orjson.JSONDecodeError:
            try:
                return json.loads(data)  # stdlib accepts Infinity/NaN natively
            except ValueError:
                pass
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None


# Keys SGLang writes after its summary when --output-details is on (S1: ``result | result_details``).
_SGLANG_DETAIL_START = b', "input_lens": ['
_SGLANG_OUTPUT_LENS = b'"output_lens": ['
_SGLANG_ERRORS = b'"errors": ['


def load_sglang_summary(path: str | Path) -> Loaded | None:
    """Fast path for big SGLang ``--output-details`` files whose summary is complete.

    Decodes the summary head, ``output_lens`` and the trailing ``errors`` list (so completed and
    failed counts and truncation are still checked: a truncated file has no parseable tail), but
    not the ``ttfts``/``itls``/``generated_texts`` arrays, which are only needed to recompute
    figures the client already wrote. Returns None whenever the layout is not exactly that, and
    the caller falls back to the full decode.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            # mmap: only the head and tail are copied; the rest is scanned in place.
            end = len(m)
            while end > 0 and m[end - 1] in _WS:
                end -= 1
            if end < 2 or m[:2] != b'{"' or m[end - 1] != 0x7D or m.find(b"\n", 0, end) >= 0:
                return None  # not one JSON object on one line (several runs, pretty JSON, a log)
            cut = m.find(_SGLANG_DETAIL_START, 0, end)
            if cut < 0:
                return None
            lens_at = m.find(_SGLANG_OUTPUT_LENS, cut, end)
            lens_end = m.find(b"]", lens_at, end) if lens_at >= 0 else -1
            err_at = m.rfind(_SGLANG_ERRORS, 0, end)
            if lens_at < 0 or lens_end < 0 or err_at < lens_end:
                return None
            head_bytes = m[:cut] + b"}"
            lens_bytes = m[lens_at + len(_SGLANG_OUTPUT_LENS) - 1 : lens_end + 1]
            tail_bytes = b"{" + m[err_at:end]
    except (OSError, ValueError):  # ValueError: mmap of an empty file
        return None
    try:
        head = parse_json_bytes(head_bytes)
        output_lens = orjson.loads(lens_bytes)
        tail = parse_json_bytes(tail_bytes)
    except (ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(head, dict) or not isinstance(tail, dict) or not isinstance(output_lens, list):
        return None
    if not sglang_summary_complete(head):
        return None
    errors = tail.get("errors")
    if not isinstance(errors, list) or len(errors) != len(output_lens):
        return None
    head["output_lens"] = output_lens
    head["errors"] = errors
    return Loaded(head, path, "jsonl-summary", 1, 1)


def load_result(path: str | Path, parse: Callable[[bytes], Any] | None = None) -> Loaded:
    """Load the benchmark result object from ``path`` or raise InputError (exit 2).

    ``parse`` replaces :func:`parse_json_bytes` for the document and for each line; it must raise
    ValueError exactly when that does (``summarize`` passes ``fastparse.parse_document``).
    """
    path = Path(path)
    parse = parse or parse_json_bytes
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, None, "file not found; expected a benchmark result file") from None
    except IsADirectoryError:
        raise InputError(path, None, "is a directory; expected a benchmark result file") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read ({exc.strerror})") from None
    if not data or data.isspace():  # not data.strip(): that copies a whole multi-MB file
        raise InputError(path, None, "file is empty; expected a benchmark result JSON object")
    try:
        obj = parse(data)
    except ValueError as exc:
        whole_err = str(exc)
    else:
        if not isinstance(obj, dict):
            raise InputError(path, None, f"expected a JSON object, got a JSON {type(obj).__name__}")
        fmt = detect_format(obj)
        if fmt == "aiperf_record":  # AIPerf's per-request JSONL holding one request
            obj = gather_records([obj]) or obj
        runs = len(obj["benchmarks"]) if fmt == "guidellm" else 1
        return Loaded(obj, path, "json", runs, None)
    return _load_lines(path, data, whole_err, parse)


def _load_lines(path: Path, data: bytes, whole_err: str, parse: Callable[[bytes], Any]) -> Loaded:
    lines = data.split(b"\n")
    nonblank = [(i + 1, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    all_objects = all(ln.startswith(b"{") for _, ln in nonblank)
    if all_objects:
        if len(nonblank) == 1:
            # A single (possibly pretty) document that does not parse: truncated or corrupt.
            raise InputError(path, None, f"invalid or truncated JSON ({whole_err}); expected one JSON object")
        objs: list[tuple[int, dict[str, Any]]] = []
        for lineno, ln in nonblank:
            try:
                obj = parse(ln)
            except ValueError as exc:
                if data.lstrip().startswith(b"{\n") or data.lstrip().startswith(b"{\r"):
                    raise InputError(path, None, f"invalid or truncated JSON ({whole_err})") from None
                raise InputError(
                    path, f"line {lineno}", f"invalid or truncated JSON object ({exc}); expected one per line"
                ) from None
            if not isinstance(obj, dict):
                raise InputError(path, f"line {lineno}", "expected a JSON object per line")
            objs.append((lineno, obj))
        records = gather_records([obj for _, obj in objs])
        if records is not None:  # AIPerf's per-request JSONL: the lines are one run, not several
            return Loaded(records, path, "jsonl", 1, None)
        lineno, obj = objs[-1]
        return Loaded(obj, path, "jsonl", len(objs), lineno)
    # A log: the first line that parses as a result object.
    first_any: tuple[int, dict[str, Any]] | None = None
    count = 0
    chosen: tuple[int, dict[str, Any]] | None = None
    for lineno, ln in nonblank:
        if not ln.startswith(b"{"):
            continue
        try:
            obj = parse(ln)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if first_any is None:
            first_any = (lineno, obj)
        if detect_format(obj) not in (None, "aiperf_record"):
            count += 1
            if chosen is None:
                chosen = (lineno, obj)
    chosen = chosen or first_any
    if chosen is None:
        if data.lstrip().startswith(b"{"):
            raise InputError(path, None, f"invalid or truncated JSON ({whole_err}); expected one JSON object")
        raise InputError(
            path,
            None,
            "no line holds a JSON result object; expected a loadgen, SGLang, vLLM, guidellm or AIPerf result",
        )
    return Loaded(chosen[1], path, "log", max(count, 1), chosen[0])
