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
from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError

_SENTINELS = {
    "__qm_Infinity__": math.inf,
    "__qm_-Infinity__": -math.inf,
    "__qm_NaN__": math.nan,
}
_VALUE_BEFORE = b":[,"
_VALUE_AFTER = b",]}"
_WS = b" \t\r\n"

# Keys that make an object look like a benchmark result (used to pick the line in a log).
RESULT_KEYS = ("completed", "schema", "duration", "mean_ttft_ms", "request_throughput")


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
    """Rewrite bare Infinity/-Infinity/NaN in value position into sentinel strings."""
    if b"Infinity" not in data and b"NaN" not in data:
        return None
    out: list[bytes] = []
    pos = 0
    n = len(data)
    changed = False
    i = 0
    while True:
        j_inf = data.find(b"Infinity", i)
        j_nan = data.find(b"NaN", i)
        cands = [j for j in (j_inf, j_nan) if j >= 0]
        if not cands:
            break
        j = min(cands)
        is_inf = j == j_inf
        tok_len = 8 if is_inf else 3
        start = j - 1 if is_inf and j > 0 and data[j - 1] == 0x2D else j  # 0x2D = "-"
        k = start - 1
        while k >= 0 and data[k] in _WS:
            k -= 1
        m = j + tok_len
        e = m
        while e < n and data[e] in _WS:
            e += 1
        if k >= 0 and data[k] in _VALUE_BEFORE and e < n and data[e] in _VALUE_AFTER:
            out.append(data[pos:start])
            out.append(b'"__qm_' + data[start:m] + b'__"')
            pos = m
            changed = True
        i = m
    if not changed:
        return None
    out.append(data[pos:])
    return b"".join(out)


def _restore(obj: Any) -> Any:
    """Map sentinel strings back to floats in top-level and nested dict values (not big lists)."""
    if isinstance(obj, dict):
        for key, val in obj.items():
            if isinstance(val, str) and val in _SENTINELS:
                obj[key] = _SENTINELS[val]
            elif isinstance(val, dict):
                _restore(val)
    return obj


def parse_json_bytes(data: bytes) -> Any:
    """Parse one JSON document, tolerating Python's Infinity/NaN tokens. Raises ValueError."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as first:
        fixed = _sanitize_nonfinite(data)
        if fixed is not None:
            try:
                return _restore(orjson.loads(fixed))
            except orjson.JSONDecodeError:
                pass
            try:
                return json.loads(data)  # stdlib accepts Infinity/NaN natively
            except ValueError:
                pass
        raise ValueError(f"{first.msg} at line {first.lineno} column {first.colno}") from None


def _looks_like_result(obj: Any) -> bool:
    return isinstance(obj, dict) and any(k in obj for k in RESULT_KEYS)


def load_result(path: str | Path) -> Loaded:
    """Load the benchmark result object from ``path`` or raise InputError (exit 2)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, None, "file not found; expected a benchmark result file") from None
    except IsADirectoryError:
        raise InputError(path, None, "is a directory; expected a benchmark result file") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read ({exc.strerror})") from None
    if not data.strip():
        raise InputError(path, None, "file is empty; expected a benchmark result JSON object")
    try:
        obj = parse_json_bytes(data)
    except ValueError as exc:
        whole_err = str(exc)
    else:
        if not isinstance(obj, dict):
            raise InputError(path, None, f"expected a JSON object, got a JSON {type(obj).__name__}")
        return Loaded(obj, path, "json", 1, None)
    return _load_lines(path, data, whole_err)


def _load_lines(path: Path, data: bytes, whole_err: str) -> Loaded:
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
                obj = parse_json_bytes(ln)
            except ValueError as exc:
                if data.lstrip().startswith(b"{\n") or data.lstrip().startswith(b"{\r"):
                    raise InputError(path, None, f"invalid or truncated JSON ({whole_err})") from None
                raise InputError(
                    path, f"line {lineno}", f"invalid or truncated JSON object ({exc}); expected one per line"
                ) from None
            if not isinstance(obj, dict):
                raise InputError(path, f"line {lineno}", "expected a JSON object per line")
            objs.append((lineno, obj))
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
            obj = parse_json_bytes(ln)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if first_any is None:
            first_any = (lineno, obj)
        if _looks_like_result(obj):
            count += 1
            if chosen is None:
                chosen = (lineno, obj)
    chosen = chosen or first_any
    if chosen is None:
        if data.lstrip().startswith(b"{"):
            raise InputError(path, None, f"invalid or truncated JSON ({whole_err}); expected one JSON object")
        raise InputError(
            path, None, "no line holds a JSON result object; expected loadgen/SGLang/vLLM result JSON"
        )
    return Loaded(chosen[1], path, "log", max(count, 1), chosen[0])
