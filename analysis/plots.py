"""PNG plots for the report (matplotlib, Agg backend, each file written atomically)."""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from analysis import atomic
from analysis.discover import Entry
from analysis.readers import BenchData


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def warm_up() -> None:
    """Import matplotlib now (lets summarize overlap the ~0.7 s import with file parsing)."""
    _plt()


def _save(fig: Any, path: Path, tight: bool = True) -> None:
    """PNG via an in-memory buffer, then an atomic write. ``tight=False`` for the per-case bar
    charts: their margins are set from the label length, because a tight bounding box costs a
    second full draw, and drawing 100+ labels is most of summarize's plotting time."""
    buf = io.BytesIO()
    opts: dict[str, Any] = {"bbox_inches": "tight"} if tight else {}
    fig.savefig(buf, format="png", dpi=90, pil_kwargs={"compress_level": 3}, **opts)
    _plt().close(fig)
    atomic.write_bytes(path, buf.getvalue())


Key = tuple[str, str, str, Any]  # suite, case, role, emulation verdict (None: a real engine)


def _agg_lookup(agg: list[dict[str, Any]]) -> dict[Key, dict[str, dict[str, Any]]]:
    out: dict[Key, dict[str, dict[str, Any]]] = {}
    for a in agg:
        out.setdefault((a["suite"], a["case_id"], a["role"], a.get("emulation_verdict")), {})[a["metric"]] = a
    return out


def _unit(emulated: bool) -> str:
    return ", emulated hardware" if emulated else ""


def _label(key: Key, m: dict[str, Any], short: bool) -> str:
    """Case name (with its verdict unless ok), plus its workload when there are few bars."""
    _suite, case_id, role, verdict = key
    name = f"{case_id}/{role}" if role and role not in case_id else case_id
    if verdict not in (None, "ok"):
        name += f" [{verdict}]"
    if short:
        return name
    return f"{name} (ISL {m.get('isl')}, OSL {m.get('osl')}, C {m.get('concurrency')}, n={m.get('n_reps')})"


def _height(n: int) -> float:
    return 1.5 + (0.28 if n <= 30 else 0.17) * n


def _margins(fig: Any, labels: list[str], n: int) -> None:
    """Leave room for the longest y label (about 0.55 em per character) without a tight bbox."""
    width_in = fig.get_size_inches()[0]
    height_in = fig.get_size_inches()[1]
    font_pt = 7 if n <= 30 else 6
    label_in = max((len(s) for s in labels), default=10) * font_pt * 0.62 / 72 + 0.3
    fig.subplots_adjust(
        left=min(0.6, label_in / width_in), right=0.98, top=1 - 0.45 / height_in, bottom=0.55 / height_in
    )


def _bars(
    ax: Any, labels: list[str], items: list[dict[str, Any] | None], xlabel: str, log: bool = False
) -> None:
    y = np.arange(len(labels))
    means = np.array([i["mean"] if i else math.nan for i in items], dtype=float)
    lo = np.array([i["ci95_low"] if i else math.nan for i in items], dtype=float)
    hi = np.array([i["ci95_high"] if i else math.nan for i in items], dtype=float)
    err = np.vstack([np.where(np.isfinite(lo), means - lo, 0), np.where(np.isfinite(hi), hi - means, 0)])
    ax.barh(
        y, np.nan_to_num(means), xerr=err, color="#4C72B0", ecolor="black", capsize=2 if len(y) <= 30 else 0
    )
    ax.set_yticks(y, labels, fontsize=7 if len(y) <= 30 else 6)
    ax.set_ylim(len(y) - 0.5, -0.5)  # first case on top (explicit: shared axes would toggle twice)
    ax.set_xlabel(xlabel)
    pos = means[np.isfinite(means) & (means > 0)]
    if log and pos.size and pos.max() / pos.min() > 20:  # prefill vs decode cases: decades apart
        ax.set_xscale("log")
    ax.grid(axis="x", alpha=0.3)


def plot_throughput(path: Path, agg: list[dict[str, Any]], emulated: bool = False) -> bool:
    lookup = _agg_lookup(agg)
    keys = [k for k, v in lookup.items() if "output_throughput" in v]
    if not keys:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, _height(len(keys))))
    labels = [_label(k, lookup[k]["output_throughput"], len(keys) > 30) for k in keys]
    _bars(
        ax,
        labels,
        [lookup[k]["output_throughput"] for k in keys],
        f"output throughput (tok/s{_unit(emulated)}), mean of reps, 95% CI",
    )
    ax.set_title("Output token throughput per case")
    _margins(fig, labels, len(keys))
    _save(fig, path, tight=False)
    return True


def plot_latency(path: Path, agg: list[dict[str, Any]], emulated: bool = False) -> bool:
    lookup = _agg_lookup(agg)
    keys = [k for k, v in lookup.items() if "ttft_p95_ms" in v or "tpot_p95_ms" in v]
    if not keys:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, _height(len(keys))), sharey=True)
    labels = [_label(k, next(iter(lookup[k].values())), len(keys) > 30) for k in keys]
    _bars(
        axes[0],
        labels,
        [lookup[k].get("ttft_p95_ms") for k in keys],
        f"TTFT p95 (ms{_unit(emulated)}), mean of reps, 95% CI",
        log=True,
    )
    _bars(
        axes[1],
        labels,
        [lookup[k].get("tpot_p95_ms") for k in keys],
        f"TPOT p95 (ms{_unit(emulated)}), mean of reps, 95% CI",
    )
    axes[0].set_title("TTFT p95 per case")
    axes[1].set_title("TPOT p95 per case")
    _margins(fig, labels, len(keys))
    fig.subplots_adjust(wspace=0.05)
    _save(fig, path, tight=False)
    return True


def plot_ab(path: Path, ab: list[dict[str, Any]]) -> bool:
    if not ab:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['metric']}\n({r['statistic']})" for r in ab]
    ch = np.array([r["change_pct"] for r in ab], dtype=float)
    lo = np.array([r["ci95_low"] for r in ab], dtype=float)
    hi = np.array([r["ci95_high"] for r in ab], dtype=float)
    err = np.vstack([np.where(np.isfinite(lo), ch - lo, 0), np.where(np.isfinite(hi), hi - ch, 0)])
    err = np.clip(np.nan_to_num(err), 0, None)
    colors = ["#C44E52" if r["verdict"] == "outside noise" else "#8C8C8C" for r in ab]
    ax.bar(labels, np.nan_to_num(ch), yerr=err, color=colors, capsize=4)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("change vs control (%), 95% CI")
    n = ab[0]["n_reps"]
    ax.set_title(f"decode_background vs control ({n} rep(s); red = outside noise)")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)
    return True


def plot_itl_timeline(
    path: Path,
    data: BenchData,
    t_inj: float | None,
    rep: Any,
    workload: str,
    inj_e2e_s: float | None = None,
    emulated: bool = False,
) -> bool:
    if data.timeline is None or data.timeline[0].size == 0:
        return False
    epoch, itl = data.timeline
    origin = (
        data.t0_epoch_s + data.main_start_s
        if data.t0_epoch_s is not None and data.main_start_s is not None
        else epoch.min()
    )
    t = epoch - origin
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(t, itl, ",", color="#4C72B0", alpha=0.5, rasterized=True, label="per-token ITL (each token)")
    bins = np.linspace(t.min(), t.max(), 121)
    idx = np.clip(np.digitize(t, bins) - 1, 0, len(bins) - 2)
    count = np.bincount(idx, minlength=len(bins) - 1)
    mean = np.bincount(idx, weights=itl, minlength=len(bins) - 1) / np.maximum(count, 1)
    centers = (bins[:-1] + bins[1:]) / 2
    ax.plot(centers[count > 0], mean[count > 0], color="#DD8452", lw=1.5, label="mean per time bin")
    if t_inj is not None:
        ax.axvline(t_inj - origin, color="#C44E52", lw=2, ls="--", label="prefill injection sent")
        if inj_e2e_s:
            ax.axvspan(t_inj - origin, t_inj - origin + inj_e2e_s, color="#C44E52", alpha=0.12,
                       label="injection in flight (its E2E)")  # fmt: skip
    hi = np.percentile(itl, 99.9) if itl.size else 1
    ax.set_ylim(0, max(hi * 1.2, float(np.nanmax(mean[count > 0])) * 1.2 if (count > 0).any() else 1))
    ax.set_xlabel(f"time since the background's main phase started (s{_unit(emulated)})")
    ax.set_ylabel(f"per-token ITL (ms{_unit(emulated)})")
    ax.set_title(f"Mixed rep {rep}: decode_background per-token ITL over time ({workload})")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)
    return True


# With this many cases the two per-case bar charts cost ~0.4 s of CPU each (drawing 100+ labels):
# one is drawn in a forked child while this process draws the other (the box has 2 cores).
PARALLEL_MIN_BARS = 30


def _draw_in_child(
    fn: Callable[[Path, list[dict[str, Any]], bool], bool],
    path: Path,
    agg: list[dict[str, Any]],
    emulated: bool = False,
) -> Callable[[], bool]:
    """Start ``fn(path, agg, emulated)`` in a forked child; the returned callable waits for it and
    returns what ``fn`` returned. A failure in the child (traceback on its stderr) is an error here too."""
    import multiprocessing

    def child() -> None:
        sys.exit(0 if fn(path, agg, emulated) else 3)

    proc = multiprocessing.get_context("fork").Process(target=child, name=f"plot-{path.stem}")
    proc.start()

    def wait() -> bool:
        proc.join()
        if proc.exitcode not in (0, 3):
            raise RuntimeError(f"drawing {path} failed in a child process (exit code {proc.exitcode})")
        return proc.exitcode == 0

    return wait


def make_all(
    plot_dir: Path,
    rows: list[dict[str, Any]],
    agg: list[dict[str, Any]],
    ab: list[dict[str, Any]],
    entries: list[Entry],
    datas: dict[int, BenchData],
    injections: dict[int, float],
    emulated: bool = False,
) -> list[str]:
    """Draw every plot the data allows; returns the file names relative to the run dir.

    emulated: the figures are an emulated run's, de-scaled to the emulated hardware (axes say so)."""
    made: list[str] = []
    n_bars = len({(a["suite"], a["case_id"], a["role"], a.get("emulation_verdict")) for a in agg})
    if n_bars >= PARALLEL_MIN_BARS:
        _plt()  # import before the fork: the child inherits it
        latency = _draw_in_child(plot_latency, plot_dir / "latency_p95.png", agg, emulated)
    else:
        drew = plot_latency(plot_dir / "latency_p95.png", agg, emulated)
        latency = lambda: drew  # noqa: E731
    if plot_throughput(plot_dir / "throughput.png", agg, emulated):
        made.append("plots/throughput.png")
    if latency():
        made.append("plots/latency_p95.png")
    if plot_ab(plot_dir / "ab_comparison.png", ab):
        made.append("plots/ab_comparison.png")
    for i, e in enumerate(entries):
        if e.suite != "mixed" or e.role != "decode_background" or i not in datas:
            continue
        r = rows[i]
        workload = f"ISL {r['isl']}, OSL {r['osl']}, C {r['concurrency']}, {r['num_prompts']} requests"
        name = f"mixed_itl_rep{e.rep}.png"
        inj = next((j for j, o in enumerate(entries) if o.suite == "mixed" and o.rep == e.rep
                    and o.role == "prefill_injection" and j in datas), None)  # fmt: skip
        inj_e2e = datas[inj].e2e_ms if inj is not None else None
        inj_s = float(inj_e2e.max()) / 1000.0 if inj_e2e is not None and inj_e2e.size else None
        drew = plot_itl_timeline(
            plot_dir / name, datas[i], injections.get(e.rep), e.rep, workload, inj_s, emulated
        )
        if drew:
            made.append(f"plots/{name}")
        else:
            rows[i]["status_note"] = _join_note(
                rows[i]["status_note"],
                "no ITL timeline: the result has no per-event timestamps (needs loadgen --output-details)",
            )
    return made


def _join_note(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
