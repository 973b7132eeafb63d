"""Run-time lines of a server log: KV pressure, retraction/preemption, cache flushes.

Why both log and metrics: a lab may not conclude "no preemption" unless it can show the KV was
full, and the engines say so in different places (SGLang logs each retraction and prints token usage
in its batch lines; vLLM V1 logs no per-event line, only `Preemptions: N` and `GPU KV cache usage:
X%` in its periodic stats line; V0 logged a warning per preemption). Every wording seen in real logs
is accepted; counts come with the lines themselves as quotes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# SGLang: newer "KV cache pool is full. Retract requests. #retracted_reqs: N ..." and the older
# "Decode out of memory happened. #retracted_reqs: N" / "decode out of memory happened, #retracted_reqs: N".
_SGL_RETRACT = re.compile(
    r"(?:KV cache pool is full\. Retract requests\.|[Dd]ecode out of memory happened[.,]) #retracted_reqs: "
    r"(?P<n>\d+)"
)
# vLLM V0: "Sequence group X is preempted by|in PreemptionMode.RECOMPUTE mode ..."
_VLLM_V0_PREEMPT = re.compile(r"is preempted (?:by|in) PreemptionMode\.(?P<mode>\w+)")
# vLLM V1 periodic stats: "... Running: R reqs, Waiting: W reqs[, Preemptions: P], GPU KV cache usage: U% ..."
_VLLM_STATS = re.compile(
    r"Running: (?P<run>\d+) reqs, Waiting: (?P<wait>\d+) reqs(?:, Preemptions: (?P<pre>\d+))?, "
    r"GPU KV cache usage: (?P<kv>[\d.]+)%"
)
# SGLang batch lines: "... token usage: 0.97, ..." (also "full token usage:" on hybrid models).
_SGL_USAGE = re.compile(r"(?:^|[ ,])(?:full )?token usage: (?P<u>[\d.]+)")
_FLUSH_OK = ("Cache flushed successfully!", "Resetting prefix cache...")
_FLUSH_REFUSED = ("Cache not flushed because there are pending requests",)


@dataclass
class LogEvents:
    """What a run-time log says about KV pressure and flushes."""

    retractions: int = 0  # SGLang: requests retracted (sum of #retracted_reqs over lines)
    retraction_lines: list[str] = field(default_factory=list)
    preemption_warnings: int = 0  # vLLM V0: one warning per preempted sequence group
    stats_preemptions: int = 0  # vLLM V1: sum of `Preemptions: N` over stats lines
    preemption_lines: list[str] = field(default_factory=list)
    max_kv_usage: float | None = None  # fraction 0..1, from batch (SGLang) or stats (vLLM) lines
    kv_usage_line: str | None = None
    flushes: int = 0
    flushes_refused: int = 0

    def as_dict(self, quotes: int = 3) -> dict:
        d = dict(self.__dict__)
        d["retraction_lines"] = self.retraction_lines[:quotes]
        d["preemption_lines"] = self.preemption_lines[:quotes]
        return d


def scan(text: str) -> LogEvents:
    """One pass over a log."""
    ev = LogEvents()
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        m = _SGL_RETRACT.search(line)
        if m:
            ev.retractions += int(m.group("n"))
            ev.retraction_lines.append(line)
            continue
        if _VLLM_V0_PREEMPT.search(line):
            ev.preemption_warnings += 1
            ev.preemption_lines.append(line)
            continue
        m = _VLLM_STATS.search(line)
        if m:
            if m.group("pre"):
                ev.stats_preemptions += int(m.group("pre"))
                ev.preemption_lines.append(line)
            _usage(ev, float(m.group("kv")) / 100.0, line)
            continue
        if "batch" in line:
            m = _SGL_USAGE.search(line)
            if m:
                _usage(ev, float(m.group("u")), line)
                continue
        if any(k in line for k in _FLUSH_OK):
            ev.flushes += 1
        elif any(k in line for k in _FLUSH_REFUSED):
            ev.flushes_refused += 1
    return ev


def _usage(ev: LogEvents, value: float, line: str) -> None:
    if ev.max_kv_usage is None or value > ev.max_kv_usage:
        ev.max_kv_usage = value
        ev.kv_usage_line = line
