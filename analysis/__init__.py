"""quickmap's analysis: benchmark results in, trustworthy numbers out (README.md has the map).

``load_requests`` and ``load_summary`` give analysts pandas DataFrames; pandas is imported only when
one of them is called, so ``import analysis`` and the per-case CLI calls stay light.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs every CLI call ~5 ms
if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd


def load_requests(run_dir: str | Path) -> pd.DataFrame:
    """One row per request: case, rep, role, workload and verdicts, then every per-request field."""
    from analysis.frames import load_requests as load

    return load(run_dir)


def load_summary(run_dir: str | Path) -> pd.DataFrame:
    """One row per case and repetition (the columns of summary.csv)."""
    from analysis.frames import load_summary as load

    return load(run_dir)
