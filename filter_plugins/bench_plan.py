# Copyright: quickmap contributors
# Apache-2.0
"""Jinja filters that hand the roles the bench plan built in Python (module_utils/bench_plan.py).

Called once per suite (bench and mixed roles) and once per lab run list (labs role, time limits only).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from module_utils import bench_plan as _plan
except ImportError:  # a checkout run from elsewhere: the repository root holds module_utils/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from module_utils import bench_plan as _plan


def bench_runs(
    plan: list[dict],
    repetitions: Any,
    num_prompts_cap: Any,
    case_num_prompts: dict,
    per_case_timeouts: dict,
    timeout_s: Any,
    kill_after_s: Any,
    clients: Any = 1,
) -> list[dict]:
    """The fixed suite's case runs (bench_plan.fixed_runs)."""
    return _plan.fixed_runs(
        list(plan),
        repetitions,
        num_prompts_cap,
        dict(case_num_prompts or {}),
        dict(per_case_timeouts or {}),
        timeout_s,
        kill_after_s,
        clients,
    )


def mixed_runs(
    decode: dict,
    injection: dict,
    repetitions: Any,
    per_case_timeouts: dict,
    timeout_s: Any,
    kill_after_s: Any,
) -> list[dict]:
    """The mixed A/B's case runs (bench_plan.mixed_runs)."""
    return _plan.mixed_runs(
        dict(decode), dict(injection), repetitions, dict(per_case_timeouts or {}), timeout_s, kill_after_s
    )


def case_timeouts(case_timeout_s: Any, kill_after_s: Any) -> dict[str, int]:
    """Every time limit of one run (bench_plan.case_timeouts)."""
    return _plan.case_timeouts(case_timeout_s, kill_after_s)


class FilterModule:
    """quickmap_* plan filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "quickmap_bench_runs": bench_runs,
            "quickmap_mixed_runs": mixed_runs,
            "quickmap_case_timeouts": case_timeouts,
        }
