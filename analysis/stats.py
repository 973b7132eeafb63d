"""Statistics across repetitions and between the A/B roles.

- Repetitions: mean, sample std (ddof=1), coefficient of variation (std/mean) and a percentile
  bootstrap 95% CI of the mean. The RNG is seeded from the group name, so a report is
  reproducible and does not change when other cases are added.
- A/B: percentage change of background vs control; CI by bootstrap (request-level for latency
  percentiles, repetition-level for throughput); Mann-Whitney U (two-sided, scipy) on the
  request-level TTFT/TPOT/E2E samples says whether the shift is outside run-to-run noise.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
ALPHA = 0.05


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded from a stable hash of ``name``."""
    return np.random.default_rng(zlib.crc32(name.encode("utf-8")))


def rep_stats(values: np.ndarray, name: str) -> dict[str, float]:
    """Across-repetition statistics of one metric (NaN where undefined, e.g. CI with one rep)."""
    v = values[np.isfinite(values)]
    n = v.size
    out = {
        "n": float(n),
        "mean": math.nan,
        "std": math.nan,
        "cv": math.nan,
        "ci95_low": math.nan,
        "ci95_high": math.nan,
    }
    if n == 0:
        return out
    mean = float(v.mean())
    out["mean"] = mean
    if n >= 2:
        std = float(v.std(ddof=1))
        out["std"] = std
        out["cv"] = std / mean if mean else math.nan
        idx = rng_for(name).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
        boots = v[idx].mean(axis=1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        out["ci95_low"], out["ci95_high"] = float(lo), float(hi)
    return out


def pct_change(control: float, treatment: float) -> float:
    """100 * (treatment - control) / control."""
    if not math.isfinite(control) or not math.isfinite(treatment) or control == 0:
        return math.nan
    return 100.0 * (treatment - control) / control


def bootstrap_pct_change_quantile(
    control: np.ndarray, treatment: np.ndarray, q: float, name: str, resamples: int = 1000
) -> tuple[float, float]:
    """95% CI of the % change of the q-th percentile, resampling requests within each role."""
    c = control[np.isfinite(control)]
    t = treatment[np.isfinite(treatment)]
    if c.size < 2 or t.size < 2:
        return math.nan, math.nan
    rng = rng_for(name)
    cq = np.percentile(c[rng.integers(0, c.size, size=(resamples, c.size))], q, axis=1)
    tq = np.percentile(t[rng.integers(0, t.size, size=(resamples, t.size))], q, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = 100.0 * (tq - cq) / cq
    change = change[np.isfinite(change)]
    if change.size == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(change, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_pct_change_mean(control: np.ndarray, treatment: np.ndarray, name: str) -> tuple[float, float]:
    """95% CI of the % change of the mean, resampling repetitions (needs >= 2 per role)."""
    c = control[np.isfinite(control)]
    t = treatment[np.isfinite(treatment)]
    if c.size < 2 or t.size < 2:
        return math.nan, math.nan
    rng = rng_for(name)
    cm = c[rng.integers(0, c.size, size=(BOOTSTRAP_RESAMPLES, c.size))].mean(axis=1)
    tm = t[rng.integers(0, t.size, size=(BOOTSTRAP_RESAMPLES, t.size))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = 100.0 * (tm - cm) / cm
    change = change[np.isfinite(change)]
    if change.size == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(change, [2.5, 97.5])
    return float(lo), float(hi)


def mann_whitney(control: np.ndarray, treatment: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value on request-level samples (NaN if too few)."""
    c = control[np.isfinite(control)]
    t = treatment[np.isfinite(treatment)]
    if c.size < 2 or t.size < 2:
        return math.nan
    from scipy.stats import mannwhitneyu  # lazy: scipy.stats costs ~0.9 s to import

    return float(mannwhitneyu(t, c, alternative="two-sided").pvalue)
