"""The labs of issues 18 and 19 (quant_matrix, ...): where judge.py finds their figures, verdict and
pitfalls.

Why a registry: these labs read their evidence from the lab directory itself (kernel lines, GPU
memory, accuracy files, traces) as well as from the loaded variants, so their steps take the lab
directory and the plan; the catalogue labs keep their dispatch in figures.py and verdicts.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.labs import pd_disagg, quant, sched_profile, tp
from analysis.labs.load import Variant
from analysis.labs.verdicts import Verdict


@dataclass(frozen=True)
class AdvancedLab:
    figures: Callable[[Path, dict[str, Any], dict[str, Variant], str], dict[str, Any]]
    judge: Callable[[dict[str, Any], list[dict[str, Any]], dict[str, Any], dict[str, Any]], Verdict]
    pitfalls: Callable[[dict[str, Any], dict[str, Any]], list[str]]
    timed: bool  # the verdict rests on time: a saturated emulator makes it inconclusive


LABS = {
    "quant_matrix": AdvancedLab(quant.figures, quant.judge, quant.pitfalls, timed=True),
    "tp_scaling": AdvancedLab(tp.figures, tp.judge, tp.pitfalls, timed=True),
    # rests on sample shares and trace spans, not on client-visible time
    "sched_profile": AdvancedLab(
        sched_profile.figures, sched_profile.judge, sched_profile.pitfalls, timed=False
    ),
    "pd_disagg": AdvancedLab(pd_disagg.figures, pd_disagg.judge, pd_disagg.pitfalls, timed=True),
}
