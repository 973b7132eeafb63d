"""The pictures a person would rather look at than read: gap timelines, TPOT distributions, KV use.

Each function draws from lab.json's figures only (what the report states is what is drawn) and
returns the plot's path relative to the lab directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt


def _save(fig: Any, lab_dir: Path, name: str) -> str:
    out = lab_dir / "plots" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return f"plots/{name}"


def _unit(doc: dict[str, Any]) -> str:
    return " (emulated)" if doc.get("emulated") else ""


def tpot_distribution(lab_dir: Path, doc: dict[str, Any]) -> str | None:
    """Box plot of per-request TPOT per variant and run (sweeps), or per variant (token budget)."""
    vs = doc["figures"]["variants"]
    data, labels = [], []
    for name, rows in vs.items():
        if "tpot_samples_ms" in rows:  # token_budget: one pool per variant
            if rows["tpot_samples_ms"]:
                data.append(rows["tpot_samples_ms"])
                labels.append(name)
            continue
        for run, r in sorted(rows.items(), key=lambda kv: kv[1].get("concurrency") or 0):
            if r.get("tpot_samples_ms"):
                data.append(r["tpot_samples_ms"])
                labels.append(
                    f"{name}\nC={r.get('concurrency')}" if r.get("concurrency") else f"{name}\n{run}"
                )
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(data)), 3.6))
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("TPOT per request (ms)")
    ax.set_title(f"{doc['lab']} on {doc['engine']}: TPOT distribution{_unit(doc)}")
    return _save(fig, lab_dir, "tpot_distribution.png")


def gap_timeline(lab_dir: Path, doc: dict[str, Any]) -> str | None:
    """Client-visible gap of each stream event against time, injection window shaded, per variant."""
    vs = doc["figures"]["variants"]
    panels = []
    for name, r in vs.items():
        rep = next((x for x in r["reps"].values() if x.get("valid") and x.get("timeline")), None)
        if rep:
            panels.append((name, rep))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.3 * len(panels)), sharex=True, squeeze=False)
    for ax, (name, rep) in zip(axes[:, 0], panels, strict=True):
        t = rep["timeline"]["t_ms"]
        gaps = [b - a for a, b in itertools.pairwise(t)]
        ax.plot(t[1:], gaps, marker=".", linewidth=0.8)
        lo, hi = rep["timeline"]["injection_ms"]
        ax.axvspan(lo, hi, alpha=0.2, color="tab:red", label="injection in flight")
        ax.set_ylabel("gap (ms)")
        ax.set_title(f"{name}: max gap during {rep['max_gap_during_ms']} ms", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(f"time since the stream's first event (ms){_unit(doc)}")
    return _save(fig, lab_dir, "gap_timeline.png")


def kv_timeline(lab_dir: Path, doc: dict[str, Any]) -> str | None:
    """KV usage, running and waiting requests over each run (sampled /metrics)."""
    series = []
    for name, v in doc["figures"]["variants"].items():
        for rn, r in v["runs"].items():
            if r["timeline"]["t_s"]:
                series.append((f"{name}/{rn}", r["timeline"]))
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.4 * len(series)), squeeze=False)
    for ax, (label, tl) in zip(axes[:, 0], series, strict=True):
        ax.plot(tl["t_s"], tl["kv_usage"], color="tab:red", label="KV usage")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("KV usage")
        ax2 = ax.twinx()
        if len(tl["running"]) == len(tl["t_s"]):
            ax2.plot(tl["t_s"], tl["running"], color="tab:blue", label="running", linewidth=0.8)
        if len(tl["waiting"]) == len(tl["t_s"]):
            ax2.plot(tl["t_s"], tl["waiting"], color="tab:gray", label="waiting", linewidth=0.8)
        ax2.set_ylabel("requests")
        ax.set_title(label, fontsize=9)
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [h.get_label() for h in lines], fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel(f"time (s){_unit(doc)}")
    return _save(fig, lab_dir, "kv_timeline.png")


def ttft_by_isl(lab_dir: Path, doc: dict[str, Any]) -> str | None:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    drawn = False
    for name, rows in doc["figures"]["variants"].items():
        pts = sorted((r["isl"], r["ttft_p50_ms"]) for r in rows.values() if r.get("ttft_p50_ms") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_title(f"prefill sweep on {doc['engine']}{_unit(doc)}")
    ax.legend(fontsize=8)
    return _save(fig, lab_dir, "ttft_by_isl.png")


_DRAW = {
    "eager_vs_graph": [tpot_distribution],
    "decode_sweep": [tpot_distribution],
    "token_budget": [tpot_distribution],
    "chunk_interference": [gap_timeline],
    "kv_pressure": [kv_timeline],
    "prefill_sweep": [ttft_by_isl],
}


def draw(lab_dir: Path, doc: dict[str, Any]) -> list[str]:
    """Every picture of this lab (judge.PLOTTED names the labs listed here)."""
    out = []
    for fn in _DRAW.get(doc["lab"], []):
        path = fn(lab_dir, doc)
        if path:
            out.append(path)
    return out
