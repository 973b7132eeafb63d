"""Synthetic enginesim /metrics scrapes for the verdict and report tests."""

from __future__ import annotations


def scrape(scale: float, emulated: float, wall: float, steps: int, late: int = 0, changes: int = 0) -> str:
    """An enginesim /metrics text: `late` of `steps` written later than a tenth of their step."""
    on_time = steps - late
    buckets = {0.01: on_time, 0.02: on_time, 0.05: on_time, 0.1: on_time, 0.2: steps, 0.5: steps}
    lines = [
        "# HELP sglang:num_running_reqs x", "# TYPE sglang:num_running_reqs gauge",
        "sglang:num_running_reqs 0.0",
        "# HELP enginesim:time_scale x", "# TYPE enginesim:time_scale gauge", f"enginesim:time_scale {scale}",
        "# HELP enginesim:time_scale_auto x", "# TYPE enginesim:time_scale_auto gauge",
        "enginesim:time_scale_auto 1.0",
    ]  # fmt: skip
    for name, value in (
        ("time_scale_changes", changes),
        ("emulated_seconds", emulated),
        ("wall_seconds", wall),
        ("slip_seconds", 0.0),
        ("slips", 0),
        ("steps", steps),
        ("events", steps * 32),
    ):
        lines += [f"# HELP enginesim:{name} x", f"# TYPE enginesim:{name} counter"]
        lines.append(f"enginesim:{name}_total {float(value)}")
    lines += ["# HELP enginesim:step_lag_steps x", "# TYPE enginesim:step_lag_steps histogram"]
    lines += [f'enginesim:step_lag_steps_bucket{{le="{le}"}} {float(n)}' for le, n in buckets.items()]
    lines += [
        f'enginesim:step_lag_steps_bucket{{le="+Inf"}} {float(steps)}',
        "enginesim:step_lag_steps_sum 0.0",
        f"enginesim:step_lag_steps_count {float(steps)}",
    ]
    return "\n".join(lines) + "\n"


ZERO = scrape(10.0, 0.0, 0.0, 0)
