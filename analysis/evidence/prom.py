"""Prometheus text exposition, parsed with prometheus_client's own parser (never with regexes).

Why a parser: real scrapes carry label sets per TP/DP rank and engine index, histogram buckets,
`_created` timestamps and families declared without samples; a line-splitting reader gets one of
those wrong sooner or later. Values are kept per sample name (so `vllm:num_preemptions_total` is
found under the name the server wrote) with every label set; callers choose how to combine ranks:
`total` (sum: counters, running requests over DP engines) or `peak` (max: a usage fraction that
every TP rank reports alike).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from analysis.errors import InputError

# A line the labs' sampler writes before each scrape: `# quickmap-sample <epoch seconds>`.
SAMPLE_MARKER = "# quickmap-sample "


@dataclass
class Scrape:
    """One /metrics answer: sample name -> [(labels, value)], plus the families' declared types."""

    values: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    time: float | None = None

    def has(self, name: str) -> bool:
        return name in self.values

    def total(self, *names: str) -> float | None:
        """Sum over label sets of the first name present (None when none is)."""
        for name in names:
            if name in self.values:
                return float(sum(v for _, v in self.values[name]))
        return None

    def peak(self, *names: str) -> float | None:
        """Largest value over label sets of the first name present (None when none is)."""
        for name in names:
            if self.values.get(name):
                return float(max(v for _, v in self.values[name]))
        return None


def parse(text: str, where: str | None = None) -> Scrape:
    """Parse one exposition. ``where`` names the source in the error of a malformed line."""
    scrape = Scrape()
    try:
        for family in text_string_to_metric_families(text):
            scrape.types.setdefault(family.name, family.type)
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # prometheus_client's creation timestamps, not measurements
                scrape.values.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise InputError(where, None, f"not Prometheus text exposition ({exc})") from None
    return scrape


def read(path: str | Path) -> Scrape | None:
    """Parse a scrape file; None when the file does not exist (the server had no /metrics)."""
    path = Path(path)
    if not path.is_file():
        return None
    return parse(path.read_text(encoding="utf-8", errors="replace"), str(path))


def delta(before: Scrape | None, after: Scrape | None, *names: str) -> float | None:
    """after - before of a counter (first name present in ``after``); None when it cannot be known."""
    if before is None or after is None:
        return None
    for name in names:
        if after.has(name):
            b = before.total(name)
            return after.total(name) - (b if b is not None else 0.0)  # type: ignore[operator]
    return None


def split_samples(text: str) -> Iterable[tuple[float, str]]:
    """Cut a sampler file into (time, exposition text) chunks at its `# quickmap-sample T` lines."""
    t: float | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(SAMPLE_MARKER):
            if t is not None:
                yield t, "\n".join(lines) + "\n"
            try:
                t = float(line[len(SAMPLE_MARKER) :].strip())
            except ValueError:
                t = None
            lines = []
        elif t is not None:
            lines.append(line)
    if t is not None:
        yield t, "\n".join(lines) + "\n"


def read_samples(path: str | Path) -> list[Scrape]:
    """Every complete scrape of a sampler file, in time order (a scrape cut short at the end is dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for t, text in split_samples(path.read_text(encoding="utf-8", errors="replace")):
        try:
            scrape = parse(text, f"{path} at t={t}")
        except InputError:
            continue  # the sampler was killed mid-write: only the last chunk can be torn
        if scrape.values:
            scrape.time = t
            out.append(scrape)
    return out


def series(scrapes: list[Scrape], how: str, *names: str) -> list[tuple[float, float]]:
    """(time, value) of a gauge over sampled scrapes; ``how`` is "total" or "peak" across label sets."""
    out = []
    for s in scrapes:
        v = s.total(*names) if how == "total" else s.peak(*names)
        if v is not None and s.time is not None:
            out.append((s.time, v))
    return out
