"""``summarize RUN_DIR``: every result file of a run → summary.csv/jsonl, aggregate.csv, ab.csv,
report.md and plots/*.png.

Everything is computed in memory first (:func:`compute`, also behind ``analysis.load_summary``) and
written at the end, each file atomically. A structural error (a rep directory with neither file, a
corrupt meta.json, a directory that holds no run and no result) stops the command (exit 2) before
anything is written; a result file that cannot be read is listed in the report with its reason and
the rest is summarised (the CLI then exits 3). Whether a case is complete and whether the A/B
overlapped is decided by the one judge in ``module_utils/verdicts.py``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from analysis import atomic, crosscheck, emulation
from analysis.atomic import read_json_object
from analysis.discover import Entry, discover
from analysis.errors import InputError
from analysis.readers import METRICS, STATS, BenchData, read_bench
from analysis.stats import (
    bootstrap_pct_change_mean,
    bootstrap_pct_change_quantile,
    mann_whitney,
    pct_change,
    rep_stats,
)
from analysis.values import as_int
from module_utils.verdicts import judge_case, judge_overlap

SUMMARY_COLUMNS = [
    "suite", "case_id", "role", "rep", "stage", "status", "error_type", "reason", "status_note",
    "isl", "osl", "concurrency", "num_prompts", "warmup",
    "source_format", "source_client", "bench_file", "runs_in_file", "reliable", "per_request_arrays",
    "completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    *[f"{m}_{s}_ms" for m in METRICS for s in STATS],
    *[f"{m}_source" for m in METRICS],
    *emulation.COLUMNS,
]  # fmt: skip
AGG_METRICS = [
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    *[f"{m}_{s}_ms" for m in METRICS for s in ("mean", "p50", "p90", "p95", "p99")],
]  # fmt: skip
AGG_COLUMNS = [
    "suite", "case_id", "role", "source_client", "stage", "isl", "osl", "concurrency", "num_prompts",
    "n_reps", "n_unknown", "metric", "mean", "std", "cv", "ci95_low", "ci95_high",
    "emulation_verdict", "time_scales",
]  # fmt: skip
AB_METRICS = (
    ("output_throughput", "output tok/s", "mean over reps", None, None),
    ("ttft_p95_ms", "TTFT", "p95", "ttft_ms", 95.0),
    ("tpot_p95_ms", "TPOT", "p95", "tpot_ms", 95.0),
    ("e2e_p95_ms", "E2E", "p95", "e2e_ms", 95.0),
)
AB_COLUMNS = [
    "metric", "statistic", "control", "background", "change_pct", "ci95_low", "ci95_high",
    "mann_whitney_p", "verdict", "n_reps", "control_requests", "background_requests",
]  # fmt: skip
USABLE = ("completed", "unknown")
PARALLEL_MIN_FILES = 8


Job = tuple[str, bool, str | None]  # result file, want per-request arrays, AIPerf records beside it


def _read_one(job: Job) -> BenchData | tuple[str | None, str | None, str]:
    """Worker: read one file; errors come back as plain tuples (InputError does not pickle)."""
    path, want, details = job
    try:
        return read_bench(path, want, details)
    except InputError as exc:
        return (exc.path, exc.where, exc.expected)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt() parameters


def _tune_allocator() -> None:
    """Worker start-up: let freed multi-MB blocks be reused instead of mapped afresh (glibc only).

    Each result file is read into one buffer of several MB and decoded into a few MB of arrays;
    by default glibc maps such blocks fresh from the kernel and unmaps them on free, so every file
    paid ~3,500 page faults, about a quarter of the full-decode CPU time. Raising the mmap and
    trim thresholds keeps them in the heap for the next file. A no-op where mallopt is missing.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # 32 MiB: glibc's documented maximum
        libc.mallopt(_M_TRIM_THRESHOLD, 128 << 20)
    except (OSError, AttributeError):
        pass


def _read_all(
    jobs: list[Job], warm_plots: bool = True
) -> list[BenchData | tuple[str | None, str | None, str]]:
    """Read every result file; with many files, in two worker processes (the box has 2 cores)
    while this process imports matplotlib, which it needs next anyway (unless ``warm_plots`` is off:
    ``load_summary`` draws nothing)."""
    workers = min(2, os.cpu_count() or 1)
    if len(jobs) < PARALLEL_MIN_FILES or workers < 2:
        return [_read_one(j) for j in jobs]
    import multiprocessing

    with ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("fork"), initializer=_tune_allocator
    ) as pool:
        results = pool.map(_read_one, jobs, chunksize=max(1, len(jobs) // (workers * 4)))
        if warm_plots:
            from analysis import plots

            plots.warm_up()
        return list(results)


def _meta_int(meta: dict[str, Any], key: str) -> int | None:
    return as_int(meta.get(key))


def _base_row(e: Entry) -> dict[str, Any]:
    m = e.meta
    status = str(m.get("status")) if m else "unknown"
    note = "no meta.json: a result quickmap did not write; not checked against a plan"
    return {
        "suite": str(m.get("suite") or e.suite),
        "case_id": e.case_id,
        "role": e.role,
        "rep": e.rep,
        "stage": m.get("stage") or ("mixed" if e.suite == "mixed" else ""),
        "status": status,
        "error_type": m.get("error_type") if status == "failed" else None,
        "reason": m.get("reason") if status == "failed" else None,
        "status_note": "" if m else note,
        "isl": _meta_int(m, "isl"),
        "osl": _meta_int(m, "osl"),
        "concurrency": _meta_int(m, "concurrency"),
        "num_prompts": _meta_int(m, "num_prompts"),
        "warmup": _meta_int(m, "warmup"),
        "bench_file": str(e.bench) if e.bench else None,
    }


_COUNT_KEYS = ("completed", "failed", "total_input_tokens", "total_output_tokens", "num_prompts")


def _fill_from_bench(row: dict[str, Any], data: BenchData) -> None:
    for key, value in data.row().items():
        if key in SUMMARY_COLUMNS and row.get(key) is None:  # meta (the plan) wins over the file
            row[key] = as_int(value) if key in _COUNT_KEYS and as_int(value) is not None else value
    for key, scalar in (
        ("isl", "random_input_len"),
        ("osl", "random_output_len"),
        ("concurrency", "max_concurrency"),
    ):
        if row[key] is None:
            row[key] = as_int(data.scalars.get(scalar))
    if row["num_prompts"] is None:
        n = as_int(data.scalars.get("num_prompts"))
        if n is None and data.scalars.get("completed") is not None:
            n = int(data.scalars["completed"] + (data.scalars.get("failed") or 0))
        row["num_prompts"] = n
    if data.reliable is False:
        row["status_note"] = _join(row["status_note"], "client timing unreliable (loadgen reliable=false)")
    if data.runs_in_file > 1:
        row["status_note"] = _join(
            row["status_note"], f"file holds {data.runs_in_file} runs; the last was used"
        )


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _judge(row: dict[str, Any], entry: Entry, data: BenchData | None) -> None:
    """The case judge on one repetition: a ``completed`` one against its plan (meta's request count,
    OSL and output fraction, the rules its bench_case module used); a result without a plan
    (``unknown``) only against the rules that need none (finished, finite values)."""
    if row["status"] not in ("completed", "unknown"):
        return
    if data is None:
        if row["status"] == "completed":
            row.update(status="failed", error_type="BENCH_FAILED", reason="no bench.json")
            row["status_note"] = _join(row["status_note"], "meta said completed but no bench.json")
        return
    planned = row["status"] == "completed"
    fraction = entry.meta.get("min_output_fraction", 1.0)
    fraction = float(fraction) if isinstance(fraction, int | float) and 0 < fraction <= 1 else 1.0
    verdict = judge_case(
        data.facts,
        row["num_prompts"] if planned else None,
        as_int(entry.meta.get("osl")) if planned else None,
        fraction,
    )
    reason = verdict["reason"]
    if reason is None:
        return
    if reason == "nonfinite":
        row["reliable"] = False
    got = data.facts.get("completed")
    if reason == "incomplete":
        problem = "bench.json says complete=false"
    elif reason == "count" and got is not None:
        problem = f"bench.json shows {got} completed of {row['num_prompts']} planned"
    else:
        problem = str(verdict["problem"])
    said = "meta said completed" if planned else "no meta.json"
    row.update(status="failed", error_type="BENCH_FAILED", reason=problem)
    row["status_note"] = _join(row["status_note"], f"{said} but {problem}")


def _check_overlap(
    rows: list[dict[str, Any]], datas: dict[int, BenchData], entries: list[Entry]
) -> dict[int, float]:
    """Mixed: mark a background that ended before the injection as failed; return injection epochs by rep."""
    inject: dict[int, float] = {}
    by_rep: dict[Any, dict[str, int]] = {}
    for i, e in enumerate(entries):
        if e.suite == "mixed":
            by_rep.setdefault(e.rep, {})[e.role] = i
    for rep, roles in by_rep.items():
        t_inj = None
        if (j := roles.get("prefill_injection")) is not None:
            d = datas.get(j)
            if d is not None and d.first_send_epoch_s is not None:
                t_inj = d.first_send_epoch_s
            elif isinstance(entries[j].meta.get("injection_sent_epoch_s"), int | float):
                t_inj = float(entries[j].meta["injection_sent_epoch_s"])
        b = roles.get("decode_background")
        if b is None:
            continue
        if t_inj is None and isinstance(entries[b].meta.get("injection_sent_epoch_s"), int | float):
            t_inj = float(entries[b].meta["injection_sent_epoch_s"])
        if t_inj is not None and rep is not None:
            inject[rep] = t_inj
        row, d = rows[b], datas.get(b)
        if row["error_type"] == "BACKGROUND_FINISHED_BEFORE_INJECTION":
            row["status"] = "failed"
            continue
        if row["status"] != "completed":
            continue
        if t_inj is None:
            row["status_note"] = _join(
                row["status_note"], "overlap with the injection not verifiable (no injection time)"
            )
            continue
        t0 = d.t0_epoch_s if d is not None else None
        start = t0 + d.main_start_s if t0 is not None and d.main_start_s is not None else None
        end = t0 + d.main_end_s if t0 is not None and d.main_end_s is not None else None
        verdict = judge_overlap(start, end, t_inj)
        if verdict["overlap"] is False:
            row.update(status="failed", error_type="BACKGROUND_FINISHED_BEFORE_INJECTION")
            row["reason"] = verdict["detail"]
            row["status_note"] = _join(row["status_note"], "summarize found no overlap")
        elif verdict["overlap"] is None:
            row["status_note"] = _join(row["status_note"], verdict["detail"])
    return inject


def _fmt_csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return repr(value)
    return value


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_fmt_csv(r.get(c)) for c in columns])
    return buf.getvalue()


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return b"".join(orjson.dumps({c: clean(r.get(c)) for c in SUMMARY_COLUMNS}) + b"\n" for r in rows)


def _workload_value(values: list[Any]) -> Any:
    uniq = sorted({v for v in values if v is not None}, key=str)
    if not uniq:
        return None
    return uniq[0] if len(uniq) == 1 else "/".join(map(str, uniq))


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long table: one row per (suite, case, role, metric) over usable repetitions."""
    # One group per client too: two clients' "TPOT" need not be the same figure (clients.py).
    groups: dict[tuple[str, str, str, Any], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["suite"], r["case_id"], r["role"], r.get("source_client")), []).append(r)
    out: list[dict[str, Any]] = []
    for (suite, case_id, role, client), members in groups.items():
        usable = [r for r in members if r["status"] in USABLE and r.get("completed") is not None]
        if not usable:
            continue
        base = {
            "suite": suite,
            "case_id": case_id,
            "role": role,
            "source_client": client,
            "n_reps": len(usable),
            "n_unknown": sum(r["status"] == "unknown" for r in usable),
        }
        for key in ("stage", "isl", "osl", "concurrency", "num_prompts"):
            base[key] = _workload_value([r.get(key) for r in usable])
        matrix = np.array([[_f(r.get(m)) for m in AGG_METRICS] for r in usable], dtype=np.float64)
        for j, metric in enumerate(AGG_METRICS):
            s = rep_stats(matrix[:, j], f"{suite}/{case_id}/{role}/{metric}")
            if s["n"] == 0:
                continue
            out.append(
                {
                    **base,
                    "metric": metric,
                    **{k: s[k] for k in ("mean", "std", "cv", "ci95_low", "ci95_high")},
                }
            )
    return out


def _f(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def ab_table(
    rows: list[dict[str, Any]], datas: dict[int, BenchData]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Background vs control over repetitions where both roles are usable."""
    by_rep: dict[Any, dict[str, int]] = {}
    for i, r in enumerate(rows):
        if r["suite"] == "mixed" and r["status"] in USABLE:
            by_rep.setdefault(r["rep"], {})[r["role"]] = i
    ordered = sorted(by_rep.items(), key=lambda kv: str(kv[0]))
    pairs = [
        (v["control"], v["decode_background"])
        for _, v in ordered
        if "control" in v and "decode_background" in v
    ]
    info: dict[str, Any] = {"reps": [rows[b]["rep"] for _, b in pairs], "pairs": pairs}
    if not pairs:
        return [], info
    out: list[dict[str, Any]] = []
    for col, label, stat, arr_name, q in AB_METRICS:
        c_vals = np.array([_f(rows[c].get(col)) for c, _ in pairs])
        b_vals = np.array([_f(rows[b].get(col)) for _, b in pairs])
        c_mean = float(np.nanmean(c_vals)) if np.isfinite(c_vals).any() else math.nan
        b_mean = float(np.nanmean(b_vals)) if np.isfinite(b_vals).any() else math.nan
        row: dict[str, Any] = {
            "metric": label,
            "statistic": stat,
            "control": c_mean,
            "background": b_mean,
            "change_pct": pct_change(c_mean, b_mean),
            "n_reps": len(pairs),
            "mann_whitney_p": math.nan,
        }
        if arr_name is None:
            lo, hi = bootstrap_pct_change_mean(c_vals, b_vals, f"ab/{col}")
            n_c = n_b = None
        else:
            c_arr = [getattr(datas[c], arr_name) for c, _ in pairs if c in datas]
            b_arr = [getattr(datas[b], arr_name) for _, b in pairs if b in datas]
            c_all = (
                np.concatenate([a for a in c_arr if a is not None])
                if any(a is not None for a in c_arr)
                else None
            )
            b_all = (
                np.concatenate([a for a in b_arr if a is not None])
                if any(a is not None for a in b_arr)
                else None
            )
            if c_all is not None and b_all is not None:
                lo, hi = bootstrap_pct_change_quantile(c_all, b_all, q, f"ab/{col}")
                row["mann_whitney_p"] = mann_whitney(c_all, b_all)
                n_c, n_b = int(c_all.size), int(b_all.size)
            else:
                lo = hi = math.nan
                n_c = n_b = None
        row.update(ci95_low=lo, ci95_high=hi, control_requests=n_c, background_requests=n_b)
        row["verdict"] = _verdict(row, arr_name is None)
        out.append(row)
    return out, info


def _verdict(row: dict[str, Any], rep_level: bool) -> str:
    lo, hi, p = row["ci95_low"], row["ci95_high"], row["mann_whitney_p"]
    ci_known = math.isfinite(lo) and math.isfinite(hi)
    excludes_zero = ci_known and (lo > 0 or hi < 0)
    if rep_level:
        if not ci_known:
            return "n/a (CI needs >= 2 reps)"
        return "outside noise" if excludes_zero else "within noise"
    if not math.isfinite(p):
        return "n/a (no per-request data)"
    if p < 0.05 and excludes_zero:
        return "outside noise"
    return "within noise"


class Summary:
    """Everything ``summarize`` computes before it writes (``load_summary`` uses it too)."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any], entries: list[Entry]) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self.entries = entries
        self.rows: list[dict[str, Any]] = []
        self.datas: dict[int, BenchData] = {}
        self.unreadable: list[tuple[str, str]] = []  # (file, why) of results that could not be read
        self.agg: list[dict[str, Any]] = []
        self.ab: list[dict[str, Any]] = []
        self.ab_info: dict[str, Any] = {}
        self.injections: dict[int, float] = {}
        # The same in the emulated hardware's units (analysis/emulation.py); the rows themselves
        # (summary.csv) when no case was emulated.
        self.e_rows: list[dict[str, Any]] = []
        self.e_datas: dict[int, BenchData] = {}
        self.e_injections: dict[int, float] = {}
        self.emulated = False
        self.message = ""


def compute(run_dir: str | Path, want_requests: bool = False, warm_plots: bool = True) -> Summary:
    """Read and judge every result of a run directory (or a flat directory of result files)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, None, "run directory not found")
    manifest = read_json_object(run_dir / "manifest.json")
    entries = discover(run_dir)
    if not entries and not (run_dir / "manifest.json").is_file():
        raise InputError(
            run_dir,
            None,
            "holds no manifest.json, no cases/ or mixed/ directory and no result file (*.json, *.jsonl, "
            "*.log); expected a quickmap run directory or a directory of benchmark result files",
        )
    # A run that stopped before its first case (e.g. a failed gate) still gets a report saying so.
    out = Summary(run_dir, manifest, entries)
    jobs: list[Job] = [
        (str(e.bench), want_requests or e.suite == "mixed", str(e.details) if e.details else None)
        for e in entries
        if e.bench is not None
    ]
    results = iter(_read_all(jobs, warm_plots))
    for i, e in enumerate(entries):
        row = _base_row(e)
        emulation.attach(row, e.dir)
        if e.suite == "files":
            row.update(suite="files", stage="", status_note="a result file in a flat directory (no plan)")
        data: BenchData | None = None
        if e.bench is not None:
            res = next(results)
            if isinstance(res, tuple):
                err = InputError(*res)
                if row["status"] in ("completed", "unknown"):
                    out.unreadable.append((str(e.bench), err.expected))
                    if row["status"] == "unknown":
                        row["status"] = "unreadable"
                    else:
                        row.update(
                            status="failed", error_type="BENCH_FAILED", reason=f"result unreadable: {err}"
                        )
                row["status_note"] = _join(row["status_note"], f"result unreadable: {err}")
            else:
                data = res
                out.datas[i] = data
                _fill_from_bench(row, data)
        _judge(row, e, data)
        out.rows.append(row)
    out.injections = _check_overlap(out.rows, out.datas, entries)
    # Emulated cases: aggregates, A/B, plots and report in the emulated hardware's units, per verdict;
    # out.rows (summary.csv) keeps the wall-clock figures as measured (analysis/emulation.py).
    view = emulation.view(out.rows, out.datas, out.injections, entries)
    out.e_rows, out.e_datas, out.e_injections, out.emulated = view
    out.agg = emulation.aggregate_by_verdict(out.e_rows, aggregate)
    out.ab, out.ab_info = ab_table(out.e_rows, out.e_datas)
    return out


def _cross_check(entries: list[Entry]) -> dict[str, Any]:
    """The fixed cases' reference-client comparisons, and the cases that ran loadgen only."""
    compared, alone = [], []
    for e in entries:
        if e.suite != "fixed":
            continue
        comp = crosscheck.compare_case(e.dir, e.meta)
        if comp is None:
            alone.append(f"{e.case_id} rep{e.rep}")
        else:
            compared.append(comp)
    return {"compared": compared, "loadgen_only": alone}


def summarize_run(run_dir: str | Path) -> Summary:
    """Compute, then write summary.csv/jsonl, aggregate.csv, ab.csv, report.md and plots/."""
    out = compute(run_dir)
    run_dir = out.run_dir
    from analysis import plots, report  # matplotlib only now that the inputs are known good

    plot_dir = run_dir / "plots"
    plot_files = plots.make_all(
        plot_dir, out.e_rows, out.agg, out.ab, out.entries, out.e_datas, out.e_injections, out.emulated
    )
    for row, e_row in zip(out.rows, out.e_rows, strict=True):
        row["status_note"] = e_row["status_note"]  # a plot's note on a repetition belongs in summary.csv too
    text = report.render(
        run_dir,
        out.manifest,
        out.e_rows,
        out.agg,
        out.ab,
        out.ab_info,
        plot_files,
        out.unreadable,
        cross_check=_cross_check(out.entries),
    )
    atomic.write_text(run_dir / "summary.csv", _csv(out.rows, SUMMARY_COLUMNS))
    atomic.write_bytes(run_dir / "summary.jsonl", _jsonl(out.rows))
    atomic.write_text(run_dir / "aggregate.csv", _csv(out.agg, AGG_COLUMNS))
    atomic.write_text(run_dir / "ab.csv", _csv(out.ab, AB_COLUMNS))
    atomic.write_text(run_dir / "report.md", text)
    n_unknown = sum(r["status"] == "unknown" for r in out.rows)
    unread = (
        f", {len(out.unreadable)} unreadable result file(s) listed in report.md" if out.unreadable else ""
    )
    out.message = (
        f"{run_dir}: {len(out.rows)} rep dir(s) ({n_unknown} unknown){unread}, {len(out.agg)} aggregate "
        f"row(s), {len(out.ab)} A/B row(s), {len(plot_files)} plot(s) -> report.md"
    )
    return out


def summarize(run_dir: str | Path) -> str:
    """Analyse a run directory; returns a one-line description of what was written."""
    return summarize_run(run_dir).message
