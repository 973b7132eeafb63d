"""Normalise any supported result object into one shape: scalars, latency statistics, arrays.

Everything is looked up by candidate field names with the unit conversion attached, so SGLang,
vLLM (old and new) and quickmap's loadgen land in the same columns:

- summary latencies are milliseconds in all three (``{stat}_{metric}_ms``; E2E is
  ``e2e_latency`` in SGLang/loadgen and ``e2el`` in vLLM; ``median`` doubles as ``p50``);
- per-request arrays are **seconds** (``ttfts``, ``itls`` list of lists, vLLM ``latencies``);
  loadgen's per-request records are milliseconds (``ttft_ms``, ``e2e_ms``, ``tpot_ms``).

A statistic the tool did not write is recomputed from the per-request arrays (numpy linear
percentiles, population std like SGLang): E2E = TTFT + sum(ITLs) when no latencies were saved,
TPOT per request = (E2E - TTFT)/(output_len - 1) when E2E and lengths are known, otherwise the
mean of that request's per-token ITLs. Where each figure came from is kept in ``sources``.
"""

from __future__ import annotations

import math
import os
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from analysis import adapters
from analysis.errors import InputError
from analysis.fastparse import Ragged, parse_document
from analysis.rawload import Loaded, all_finite, load_result, load_sglang_summary, nonfinite_value
from analysis.values import as_int
from module_utils.bench_file import detect_format, summarize

# itl = per-token ITL (each event gap split over its tokens); itl_event = one sample per content
# event. SGLang's (native backend) ITL is per token, vLLM's per streamed chunk, loadgen writes both.
METRICS = ("ttft", "tpot", "itl", "itl_event", "e2e")
STATS = ("mean", "median", "std", "p50", "p90", "p95", "p99")
_E2E = ("e2e_latency", "e2el", "e2e")
_TOOL_NAMES = {
    "loadgen": {
        "ttft": ("ttft",),
        "tpot": ("tpot",),
        "itl": ("itl_per_token",),
        "itl_event": ("itl",),
        "e2e": _E2E,
    },
    "sglang": {"ttft": ("ttft",), "tpot": ("tpot",), "itl": ("itl",), "itl_event": (), "e2e": _E2E},
    "vllm": {"ttft": ("ttft",), "tpot": ("tpot",), "itl": (), "itl_event": ("itl",), "e2e": _E2E},
    # adapters.py writes these under our own names, only where the definitions match
    "guidellm": {"ttft": ("ttft",), "tpot": ("tpot",), "itl": (), "itl_event": (), "e2e": _E2E},
    "aiperf": {"ttft": ("ttft",), "tpot": ("tpot",), "itl": (), "itl_event": ("itl_event",), "e2e": _E2E},
}
_TOOL_NAMES["aiperf_records"] = _TOOL_NAMES["aiperf"]
# Which metric a client's `itls` arrays (seconds) describe (AIPerf's: its per-chunk latencies).
_ITLS_ARE = {"loadgen": "itl", "sglang": "itl", "vllm": "itl_event", "guidellm": None,
             "aiperf": "itl_event", "aiperf_records": "itl_event"}  # fmt: skip
_ADAPTERS = {
    "guidellm": adapters.guidellm,
    "aiperf": adapters.aiperf,
    "aiperf_records": adapters.aiperf_records,
}

# (output name, candidate keys, factor to the output unit)
_SCALARS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("duration_s", ("duration", "benchmark_duration"), 1.0),
    ("completed", ("completed",), 1.0),
    ("failed", ("failed",), 1.0),
    ("total_input_tokens", ("total_input_tokens", "total_input"), 1.0),
    ("total_output_tokens", ("total_output_tokens", "total_output"), 1.0),
    ("request_throughput", ("request_throughput",), 1.0),
    ("input_throughput", ("input_throughput",), 1.0),
    ("output_throughput", ("output_throughput",), 1.0),
    ("total_throughput", ("total_throughput", "total_token_throughput"), 1.0),
    ("max_concurrency", ("max_concurrency",), 1.0),
    ("request_rate", ("request_rate",), 1.0),
    ("num_prompts", ("num_prompts",), 1.0),
    ("random_input_len", ("random_input_len",), 1.0),
    ("random_output_len", ("random_output_len",), 1.0),
    ("request_goodput", ("request_goodput", "request_goodput:"), 1.0),
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if value.strip().lower() in ("inf", "infinity"):
            return math.inf
        try:
            return float(value)
        except ValueError:
            return None
    return None


def ragged(lists: list[Any], path: Path, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(flat float array, per-row lengths) of a list of lists, without a Python loop per element."""
    try:
        lens = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        n = int(lens.sum())
        try:
            flat = np.fromiter(chain.from_iterable(lists), dtype=np.float64, count=n)
        except ValueError:  # Infinity/NaN the sentinel rewrite left as strings in the lists
            flat = np.fromiter(map(nonfinite_value, chain.from_iterable(lists)), dtype=np.float64, count=n)
    except (TypeError, ValueError):
        raise InputError(path, f"field '{field}'", "expected a list of lists of numbers") from None
    return flat, lens


def row_sums(flat: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Sum of each row of a ragged array (0 for empty rows)."""
    sums = np.zeros(len(lens), dtype=np.float64)
    nz = lens > 0
    if nz.any():
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))[nz]
        sums[nz] = np.add.reduceat(flat, starts)
    return sums


def all_numbers_finite(values: Any) -> bool:
    """The case judge's non-finite test, vectorised: a list of numbers goes through numpy at once."""
    if isinstance(values, list) and values and not isinstance(values[0], list):
        if None in values:  # numpy would read None as NaN; None is "no value", not a non-finite one
            values = [v for v in values if v is not None]
        try:
            return bool(np.isfinite(np.asarray(values, dtype=np.float64)).all())
        except (TypeError, ValueError):  # the sentinel strings of Infinity/NaN, or text
            pass
    return all_finite(values)


def describe(values: np.ndarray) -> dict[str, float]:
    """mean, median, std (population), p50/p90/p95/p99 with numpy's linear interpolation."""
    a = values[np.isfinite(values)]
    if a.size == 0:
        return dict.fromkeys(STATS, math.nan)
    p50, p90, p95, p99 = np.percentile(a, [50.0, 90.0, 95.0, 99.0])
    return {
        "mean": float(a.mean()),
        "median": float(p50),
        "std": float(a.std()),
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
    }


class BenchData:
    """One result file, normalised. Arrays hold successful requests only (ms)."""

    def __init__(self, path: Path, fmt: str, layout: str, runs_in_file: int) -> None:
        self.path = path
        self.format = fmt
        self.layout = layout
        self.runs_in_file = runs_in_file
        self.scalars: dict[str, float | None] = {}
        self.stats: dict[str, float] = {}  # "ttft_p95_ms" -> value
        self.sources: dict[str, str] = {}  # "ttft" -> tool | recomputed | tool+recomputed | missing
        self.complete: bool | None = None
        self.reliable: bool | None = None
        self.ttft_ms: np.ndarray | None = None
        self.tpot_ms: np.ndarray | None = None
        self.e2e_ms: np.ndarray | None = None
        self.t0_epoch_s: float | None = None
        self.main_start_s: float | None = None
        self.main_end_s: float | None = None
        self.first_send_epoch_s: float | None = None
        self.timeline: tuple[np.ndarray, np.ndarray] | None = None  # (epoch s, per-token ITL ms)
        self.per_request_arrays = "absent"  # present | absent | not decoded (client summary complete)
        self.client = fmt  # the writer as it names itself (e.g. "guidellm 0.8.1"), else the format
        self.facts: dict[str, Any] = {}  # module_utils.bench_file.summarize: what the case judge reads
        self.requests: dict[str, np.ndarray] | None = None  # per-request columns (want_requests)

    def row(self) -> dict[str, Any]:
        """Flat dict for summary.csv/jsonl."""
        out: dict[str, Any] = {
            "source_format": self.format,
            "source_client": self.client,
            "runs_in_file": self.runs_in_file,
        }
        out.update(self.scalars)
        out.update(self.stats)
        out.update({f"{m}_source": self.sources.get(m, "missing") for m in METRICS})
        out["reliable"] = self.reliable
        out["per_request_arrays"] = self.per_request_arrays
        return out


class _Arrays:
    """Per-request arrays pulled lazily from the object (each built at most once)."""

    def __init__(self, obj: dict[str, Any], path: Path, fmt: str) -> None:
        self.obj, self.path, self.fmt = obj, path, fmt
        self._cache: dict[str, Any] = {}
        self.records = (
            obj.get("requests") if fmt == "loadgen" and isinstance(obj.get("requests"), list) else None
        )

    def _column(self, key: str) -> np.ndarray | None:
        if self.records is None or not self.records:
            return None
        values = [r.get(key) if isinstance(r, dict) else None for r in self.records]
        try:
            try:
                col = np.array(values, dtype=np.float64)
            except ValueError:  # Infinity/NaN the sentinel rewrite left as strings in the records
                col = np.array([nonfinite_value(v) for v in values], dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(self.path, f"field 'requests[].{key}'", "expected numbers or null") from None
        return None if np.isnan(col).all() else col

    def _float_list(self, key: str, scale: float) -> np.ndarray | None:
        val = self.obj.get(key)
        if not isinstance(val, list) or not val:
            return None
        try:
            try:
                return np.array(val, dtype=np.float64) * scale
            except ValueError:  # Infinity/NaN the sentinel rewrite left as strings in the list
                return np.array([nonfinite_value(v) for v in val], dtype=np.float64) * scale
        except (TypeError, ValueError):
            raise InputError(self.path, f"field '{key}'", "expected a list of numbers") from None

    def success(self) -> np.ndarray | None:
        if "success" in self._cache:
            return self._cache["success"]
        mask = None
        if self.records:
            mask = np.fromiter(
                (bool(r.get("success")) for r in self.records), dtype=bool, count=len(self.records)
            )
        elif isinstance(self.obj.get("errors"), list) and self.obj["errors"]:
            errs = self.obj["errors"]
            mask = ~np.fromiter(map(bool, errs), dtype=bool, count=len(errs))
        elif isinstance(self.obj.get("output_lens"), list) and self.obj["output_lens"]:
            lens = self._float_list("output_lens", 1.0)
            mask = lens > 0 if lens is not None else None
        elif self.fmt == "vllm" and _num(self.obj.get("failed")):
            # vLLM without --save-detailed still writes `latencies` for every request, 0.0 for a
            # failed one (its default): without this mask the failures would pull E2E down.
            lat = self._float_list("latencies", 1.0)
            n = (_num(self.obj.get("completed")) or 0) + (_num(self.obj.get("failed")) or 0)
            mask = lat > 0 if lat is not None and len(lat) == n else None
        self._cache["success"] = mask
        return mask

    def _ok(self, arr: np.ndarray | None) -> np.ndarray | None:
        if arr is None:
            return None
        mask = self.success()
        if mask is not None:
            if len(mask) != len(arr):
                raise InputError(
                    self.path,
                    None,
                    f"per-request arrays disagree in length ({len(arr)} vs {len(mask)} requests)",
                )
            arr = arr[mask]
        return arr

    def itls(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(flat per-token ITL ms of successful requests, per-request counts)."""
        if "itls" not in self._cache:
            raw = self.obj.get("itls")
            res = None
            if isinstance(raw, Ragged | list) and len(raw):
                flat, lens = (
                    (raw.flat, raw.lens) if isinstance(raw, Ragged) else ragged(raw, self.path, "itls")
                )
                mask = self.success()
                if mask is not None and len(mask) == len(lens) and not mask.all():
                    keep = np.repeat(mask, lens)
                    flat, lens = flat[keep], lens[mask]
                res = (flat * 1000.0, lens)
            self._cache["itls"] = res
        return self._cache["itls"]

    def output_lens(self) -> np.ndarray | None:
        if "out" not in self._cache:
            col = self._column("output_tokens") if self.records else self._float_list("output_lens", 1.0)
            self._cache["out"] = self._ok(col)
        return self._cache["out"]

    def ttft(self) -> np.ndarray | None:
        if "ttft" not in self._cache:
            col = self._column("ttft_ms") if self.records else None
            if col is None:
                col = self._float_list("ttfts", 1000.0)
            self._cache["ttft"] = self._ok(col)
        return self._cache["ttft"]

    def e2e_tool(self) -> np.ndarray | None:
        if "e2e_tool" not in self._cache:
            col = self._column("e2e_ms") if self.records else None
            if col is None:
                col = self._float_list("latencies", 1000.0)
            self._cache["e2e_tool"] = self._ok(col)
        return self._cache["e2e_tool"]

    def e2e(self) -> np.ndarray | None:
        col = self.e2e_tool()
        if col is not None:
            return col
        ttft, itls = self.ttft(), self.itls()
        if ttft is not None and itls is not None and len(itls[1]) == len(ttft):
            return ttft + row_sums(*itls)
        return None

    def tpot(self) -> np.ndarray | None:
        if "tpot" in self._cache:
            return self._cache["tpot"]
        col = (
            self._ok(self._column("tpot_ms")) if self.records else self._ok(self._float_list("_tpot_ms", 1.0))
        )
        if col is None:
            e2e, ttft, out = self.e2e_tool(), self.ttft(), self.output_lens()
            if e2e is not None and ttft is not None and out is not None and len(e2e) == len(ttft) == len(out):
                multi = out > 1
                col = (e2e[multi] - ttft[multi]) / (out[multi] - 1)
            elif (itls := self.itls()) is not None:
                flat, lens = itls
                has = lens > 0
                col = row_sums(flat, lens)[has] / lens[has]
        self._cache["tpot"] = col
        return col


def _fill_stats(data: BenchData, obj: dict[str, Any], arrays: _Arrays) -> None:
    getters = {"ttft": arrays.ttft, "tpot": arrays.tpot, "e2e": arrays.e2e}
    names = _TOOL_NAMES[data.format]
    for metric in METRICS:
        tool: dict[str, float] = {}
        for stat in STATS:
            for name in names[metric]:
                keys = [f"{stat}_{name}_ms"]
                if stat == "p50":
                    keys.append(f"median_{name}_ms")
                elif stat == "median":
                    keys.append(f"p50_{name}_ms")
                val = next((v for k in keys if (v := _num(obj.get(k))) is not None), None)
                if val is not None:
                    tool[stat] = val
                    break
        missing = [s for s in STATS if s not in tool]
        recomputed: dict[str, float] = {}
        if missing:
            if metric in ("itl", "itl_event"):
                itls = arrays.itls() if _ITLS_ARE.get(data.format) == metric else None
                values = itls[0] if itls is not None else None
            else:
                values = getters[metric]()
            if values is not None and values.size:
                desc = describe(values)
                recomputed = {s: desc[s] for s in missing}
        for stat in STATS:
            data.stats[f"{metric}_{stat}_ms"] = tool.get(stat, recomputed.get(stat, math.nan))
        if tool and recomputed:
            data.sources[metric] = "tool+recomputed"
        elif tool:
            data.sources[metric] = "tool"
        elif recomputed:
            data.sources[metric] = "recomputed"
        else:
            data.sources[metric] = "missing"


def _timeline(obj: dict[str, Any], data: BenchData, path: Path) -> None:
    """Per-token ITL against wall-clock time, from loadgen records with event arrays."""
    reqs = obj.get("requests")
    t0 = _num(obj.get("t0_epoch_s"))
    if not isinstance(reqs, list) or t0 is None:
        return
    ok = [r for r in reqs if isinstance(r, dict) and r.get("success") and r.get("event_times_s")]
    sends = [r.get("send_s") for r in reqs if isinstance(r, dict) and _num(r.get("send_s")) is not None]
    if sends:
        data.first_send_epoch_s = t0 + float(min(sends))
    if not ok:
        return
    times, lens = ragged([r["event_times_s"] for r in ok], path, "requests[].event_times_s")
    toks, tlens = ragged(
        [r.get("event_tokens") or [1] * len(r["event_times_s"]) for r in ok], path, "event_tokens"
    )
    if not np.array_equal(lens, tlens):
        raise InputError(path, "field 'requests[].event_tokens'", "expected the same length as event_times_s")
    send = np.array([_num(r.get("send_s")) or 0.0 for r in ok], dtype=np.float64)
    epoch = t0 + np.repeat(send, lens) + times
    gaps = np.diff(times, prepend=np.nan)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    gaps[starts] = np.nan  # the first event of each request has no gap (that is TTFT)
    per_token = gaps / np.maximum(toks, 1.0) * 1000.0
    keep = np.isfinite(per_token)
    data.timeline = (epoch[keep], per_token[keep])


def normalise(loaded: Loaded, want_requests: bool = False, details: Loaded | None = None) -> BenchData:
    """Turn a loaded result object into BenchData; ``want_requests`` keeps per-request arrays.

    ``details``: AIPerf's per-request JSONL of the same run as an AIPerf summary (``discover`` pairs
    them), so its figures come from the summary and its arrays from the records.
    """
    raw, path = loaded.obj, loaded.path
    fmt = detect_format(raw)
    if fmt is None or fmt == "aiperf_record":
        where = f"line {loaded.line}" if loaded.line else None
        raise InputError(
            path,
            where,
            "not a recognised result (expected quickmap.loadgen/1, SGLang, vLLM, guidellm or AIPerf keys)",
        )
    data = BenchData(path, fmt, loaded.layout, loaded.runs_in_file)
    data.facts = summarize(raw, fmt, all_numbers_finite)
    obj = _ADAPTERS[fmt](raw) if fmt in _ADAPTERS else raw
    if details is not None and fmt == "aiperf" and detect_format(details.obj) == "aiperf_records":
        obj = adapters.attach_records(obj, details.obj)
    data.client = str(obj.get("_client") or _client_name(raw, fmt))
    for name, keys, factor in _SCALARS:
        val = next((v for k in keys if (v := _num(obj.get(k))) is not None), None)
        data.scalars[name] = val * factor if val is not None else None
    arrays = _Arrays(obj, path, fmt)
    if loaded.layout == "jsonl-summary":
        data.per_request_arrays = "not decoded (client summary complete)"
    elif any(
        isinstance(obj.get(k), list | Ragged) and len(obj[k])
        for k in ("ttfts", "itls", "latencies", "requests")
    ):
        data.per_request_arrays = "present"
    if data.scalars["completed"] is None:
        raise InputError(
            path, "field 'completed'", "missing or not a number; expected the completed request count"
        )
    if data.scalars["failed"] is None:
        mask = arrays.success()
        data.scalars["failed"] = float((~mask).sum()) if mask is not None else None
    dur = data.scalars["duration_s"]
    if dur and dur > 0:  # throughputs the tool did not write, from its own totals
        for rate, total in (
            ("request_throughput", "completed"),
            ("input_throughput", "total_input_tokens"),
            ("output_throughput", "total_output_tokens"),
        ):
            if data.scalars[rate] is None and data.scalars[total] is not None:
                data.scalars[rate] = data.scalars[total] / dur
        if data.scalars["total_throughput"] is None and None not in (
            data.scalars["input_throughput"],
            data.scalars["output_throughput"],
        ):
            data.scalars["total_throughput"] = (
                data.scalars["input_throughput"] + data.scalars["output_throughput"]
            )
    if fmt == "loadgen":
        data.complete = obj.get("complete") if isinstance(obj.get("complete"), bool) else None
        data.reliable = obj.get("reliable") if isinstance(obj.get("reliable"), bool) else None
        data.t0_epoch_s = _num(obj.get("t0_epoch_s"))
        data.main_start_s = _num(obj.get("main_start_s"))
        data.main_end_s = _num(obj.get("main_end_s"))
    _fill_stats(data, obj, arrays)
    if want_requests:
        data.ttft_ms, data.tpot_ms, data.e2e_ms = arrays.ttft(), arrays.tpot(), arrays.e2e()
        if fmt == "loadgen":
            _timeline(obj, data, path)
        data.requests = request_columns(obj, fmt, arrays)
    return data


def _client_name(obj: dict[str, Any], fmt: str) -> str:
    tool = obj.get("tool")
    if fmt == "loadgen" and isinstance(tool, dict) and tool.get("version"):
        return f"loadgen {tool['version']}"
    return fmt


# loadgen's per-request record fields that become DataFrame columns (analysis.load_requests)
_LOADGEN_FIELDS = ("index", "scheduled_s", "send_s", "queue_time_ms", "schedule_lag_ms", "ttft_ms", "e2e_ms",
                   "tpot_ms", "input_tokens", "output_tokens", "tokens_source", "success", "error_class",
                   "error", "http_status")  # fmt: skip


def request_columns(obj: dict[str, Any], fmt: str, arrays: _Arrays) -> dict[str, np.ndarray] | None:
    """One entry per request (failed ones included, their latencies NaN), as equal-length columns."""
    if fmt == "loadgen" and arrays.records:
        recs = arrays.records
        cols = {k: np.array([r.get(k) if isinstance(r, dict) else None for r in recs], dtype=object)
                for k in _LOADGEN_FIELDS}  # fmt: skip
        t0 = _num(obj.get("t0_epoch_s"))
        send = cols["send_s"]
        cols["send_epoch_s"] = np.array(
            [t0 + float(v) if t0 is not None and _num(v) is not None else math.nan for v in send]
        )
        return cols
    mask = arrays.success()
    n = len(mask) if mask is not None else None
    raw = {
        "ttft_ms": arrays._float_list("ttfts", 1000.0),
        "e2e_ms": arrays._float_list("latencies", 1000.0),
        "tpot_ms": arrays._float_list("_tpot_ms", 1.0),
        "input_tokens": arrays._float_list("input_lens", 1.0),
        "output_tokens": arrays._float_list("output_lens", 1.0),
    }
    itls = obj.get("itls")
    if raw["e2e_ms"] is None and raw["ttft_ms"] is not None and isinstance(itls, Ragged | list) and len(itls):
        flat, lens = (itls.flat, itls.lens) if isinstance(itls, Ragged) else ragged(itls, Path(), "itls")
        if len(lens) == len(raw["ttft_ms"]):
            raw["e2e_ms"] = raw["ttft_ms"] + row_sums(flat, lens) * 1000.0
    if raw["tpot_ms"] is None and raw["e2e_ms"] is not None and raw["ttft_ms"] is not None:
        out = raw["output_tokens"]
        if out is not None and len(out) == len(raw["e2e_ms"]):
            with np.errstate(divide="ignore", invalid="ignore"):
                raw["tpot_ms"] = np.where(out > 1, (raw["e2e_ms"] - raw["ttft_ms"]) / (out - 1), np.nan)
    present = {k: v for k, v in raw.items() if v is not None}
    if n is None:
        n = len(next(iter(present.values()))) if present else 0
    if n == 0 or any(len(v) != n for v in present.values()):
        return None  # no per-request data, or arrays that do not line up (summary-only files)
    cols: dict[str, np.ndarray] = {"index": np.arange(n)}
    ok = mask if mask is not None else np.ones(n, dtype=bool)
    cols["success"] = ok
    for key, values in present.items():
        cols[key] = np.where(ok, values, np.nan) if key.endswith("_ms") else values
    errors = obj.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        cols["error"] = np.array([e or None for e in errors], dtype=object)
    meta = obj.get("_request_meta") or {}
    starts = meta.get("start_epoch_s")
    if isinstance(starts, list) and len(starts) == n:
        cols["send_epoch_s"] = np.array([v if v is not None else math.nan for v in starts], dtype=np.float64)
    return cols


FULL_DECODE_ENV = "QUICKMAP_ANALYSIS_FULL_DECODE"


def read_bench(path: str | Path, want_requests: bool = False, details: str | Path | None = None) -> BenchData:
    """Load and normalise one result file (InputError on anything malformed).

    Without ``want_requests`` a complete SGLang summary is taken without decoding its per-request
    arrays (see :func:`analysis.rawload.load_sglang_summary`); set QUICKMAP_ANALYSIS_FULL_DECODE=1
    to always decode everything. ``details``: AIPerf's per-request JSONL beside its summary.
    """
    if not want_requests and details is None and os.environ.get(FULL_DECODE_ENV) != "1":
        fast = load_sglang_summary(path)
        if fast is not None:
            return normalise(fast, False)
    extra = load_result(details, parse_document) if details is not None else None
    return normalise(load_result(path, parse_document), want_requests, extra)


def count_int(value: float | None) -> int | None:
    """Integer view of a count scalar."""
    return as_int(value)
