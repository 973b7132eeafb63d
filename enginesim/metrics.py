"""Prometheus text exposition (stdlib), with the metric names each engine exports.

Why: quickmap scrapes /metrics before and after each case; names, types and labels must match the
real engines (sglang:* only with --enable-metrics; vllm:* always) so the same parser works on both.
"""

from __future__ import annotations

from bisect import bisect_left

SGL_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGL_ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
]
SGL_E2E_BUCKETS = [
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
]
SGL_QUEUE_BUCKETS = [
    0.0,
    0.1,
    0.2,
    0.5,
    1,
    2,
    3,
    4,
    5,
    10,
    15,
    20,
    30,
    40,
    50,
    60,
    70,
    80,
    90,
    100,
    200,
    300,
    400,
    500,
    600,
    700,
    800,
    900,
    1000,
    1200,
    1400,
    1600,
    1800,
    2000,
    2500,
    3000,
]
VLLM_TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
VLLM_ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
VLLM_E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
VLLM_ITER_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


class Histogram:
    __slots__ = ("buckets", "counts", "n", "sum")

    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float, times: int = 1, total: float | None = None) -> None:
        self.counts[bisect_left(self.buckets, v)] += times
        self.n += times
        self.sum += v * times if total is None else total

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        acc = 0
        sep = "," if labels else ""
        for b, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{float(b)}"}} {float(acc)}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(self.n)}')
        out.append(f"{name}_sum{_braces(labels)} {self.sum}")
        out.append(f"{name}_count{_braces(labels)} {float(self.n)}")
        return out


def _braces(labels: str) -> str:
    return f"{{{labels}}}" if labels else ""


class Exposition:
    """Accumulates HELP/TYPE blocks into Prometheus text format 0.0.4."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        base = name[:-6] if kind == "counter" and name.endswith("_total") else name
        self.lines.append(f"# HELP {base} {help_}")
        self.lines.append(f"# TYPE {base} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_braces(labels)} {float(value)}")

    def hist(self, name: str, help_: str, labels: str, h: Histogram) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} histogram")
        self.lines.extend(h.lines(name, labels))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
