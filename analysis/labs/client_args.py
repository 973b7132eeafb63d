"""Client flags every lab planner builds the same way (one spelling for the plain and advanced labs)."""

from __future__ import annotations


def random_dataset(isl: int, osl: int, ratio: float = 1.0) -> list[str]:
    """loadgen's random-token workload of exactly ISL in and OSL out (ratio 1.0: no length spread)."""
    return [
        "--dataset-name",
        "random",
        "--random-input-len",
        str(isl),
        "--random-output-len",
        str(osl),
        "--random-range-ratio",
        str(ratio),
    ]
