"""pandas views of a run for analysts: one row per request, one row per case and repetition.

Both read the run exactly as ``summarize`` does (:func:`analysis.summarize.compute`: the same
readers, the same case and overlap verdicts) but write nothing. pandas is imported here only, so the
CLI and the per-case state calls never pay for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.summarize import SUMMARY_COLUMNS, compute

# Columns every request row carries from its repetition: identity, workload, verdicts, provenance.
CASE_COLUMNS = (
    "suite", "case_id", "role", "rep", "stage", "isl", "osl", "concurrency", "num_prompts", "warmup",
    "status", "error_type", "reason", "reliable", "source_format", "source_client", "bench_file",
)  # fmt: skip
_CATEGORIES = ("suite", "case_id", "role", "stage", "status", "error_type", "source_format", "source_client")
_NUMERIC_SUFFIXES = ("_ms", "_s", "_tokens")
_INTEGERS = (
    "rep", "isl", "osl", "concurrency", "num_prompts", "warmup", "runs_in_file", "completed", "failed",
    "total_input_tokens", "total_output_tokens",
)  # fmt: skip


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Nullable integers and booleans where the run leaves a value unknown (None would make them object)."""
    for name in _INTEGERS:
        if name in df.columns:
            df[name] = pd.to_numeric(df[name], errors="coerce").round().astype("Int64")
    if "reliable" in df.columns:
        df["reliable"] = df["reliable"].astype("boolean")
    return df


def load_summary(run_dir: str | Path) -> pd.DataFrame:
    """One row per case and repetition: the columns of summary.csv (README "summary.csv")."""
    out = compute(run_dir, warm_plots=False)
    return _typed(pd.DataFrame(out.rows, columns=SUMMARY_COLUMNS))


def _request_frame(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    df = pd.DataFrame(cols)
    for name in df.columns:
        if name.endswith(_NUMERIC_SUFFIXES) or name in ("index", "http_status"):
            df[name] = pd.to_numeric(df[name], errors="coerce")
    if "success" in df.columns:
        df["success"] = df["success"].astype(bool)
    return df


def load_requests(run_dir: str | Path) -> pd.DataFrame:
    """One row per request of every readable result: the repetition's ``CASE_COLUMNS`` (workload and
    verdicts), then the request's own fields (``index, success, ttft_ms, tpot_ms, e2e_ms,
    input_tokens, output_tokens, error``…; loadgen adds its record fields, e.g. ``send_s``,
    ``queue_time_ms``, ``error_class``). Failed requests are rows too, with NaN latencies. A result
    without per-request data (a summary-only file) contributes no rows."""
    out = compute(run_dir, want_requests=True, warm_plots=False)
    frames = []
    for i, row in enumerate(out.rows):
        data = out.datas.get(i)
        if data is None or not data.requests:
            continue
        df = _request_frame(data.requests)
        for pos, name in enumerate(CASE_COLUMNS):
            df.insert(pos, name, row.get(name))
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=[*CASE_COLUMNS, "index", "success", "ttft_ms", "tpot_ms", "e2e_ms"])
    df = _typed(pd.concat(frames, ignore_index=True))
    for name in _CATEGORIES:
        df[name] = df[name].astype("category")
    return df
