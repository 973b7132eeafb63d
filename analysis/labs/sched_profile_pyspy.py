"""py-spy's raw (collapsed-stack) profile of the scheduler process: the share of samples spent in the
scheduling functions.

Why this file format: `py-spy record --format raw` writes one line per distinct stack,
`frame;frame;...;leaf count`, each frame `function (file:line)`; it is the flame graph's input, so the
share read here is the share the SVG shows. A sample counts as scheduling when any frame of its stack
is one of the engine's scheduling functions (the batch selection and admission, not the forward pass
or the output processing, which is counted apart). Streamed line by line; a profile is a few thousand
lines.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

# (file pattern, function pattern) per engine: the real engine's scheduling functions and enginesim's.
SCHED_FUNCS = {
    "sglang": [
        (
            r"sglang/srt/managers/scheduler\.py",
            r"get_next_batch_to_run|get_new_batch_prefill|update_running_batch",
        ),
        (r"sglang/srt/managers/schedule_policy\.py", r".*"),
        (r"enginesim/flavours/sglang\.py", r"plan|_plan|_prefill|_check_decode_mem|_retract"),
        (r"enginesim/scheduler\.py", r"plan|_admit_prefix|_unadmit"),
    ],
    "vllm": [
        (r"vllm/v1/core/sched/scheduler\.py", r"schedule"),
        (r"enginesim/flavours/vllm\.py", r"plan|_plan|_preempt"),
        (r"enginesim/scheduler\.py", r"plan|_admit_prefix|_unadmit"),
    ],
}
# The step's output processing (tokens appended, finishes, stream events), counted apart.
OUTPUT_FUNCS = {
    "sglang": [
        (r"sglang/srt/managers/scheduler.*\.py", r"process_batch_result.*"),
        (r"enginesim/scheduler\.py", r"apply"),
    ],
    "vllm": [
        (r"vllm/v1/core/sched/scheduler\.py", r"update_from_output"),
        (r"enginesim/scheduler\.py", r"apply"),
    ],
}
_FRAME = re.compile(r"(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)")


def rules(
    table: dict[str, list[tuple[str, str]]], engine: str
) -> list[tuple[re.Pattern[str], re.Pattern[str]]]:
    return [(re.compile(f), re.compile(fn)) for f, fn in table[engine]]


def _hit(frame: str, compiled: list[tuple[re.Pattern[str], re.Pattern[str]]]) -> bool:
    m = _FRAME.fullmatch(frame)
    if not m:
        return False
    return any(f.search(m["file"]) and fn.fullmatch(m["func"]) for f, fn in compiled)


def share(
    path: Path, engine: str, rate_hz: float | None = None, duration_s: float | None = None
) -> dict[str, Any]:
    """Samples, the share in scheduling and in output processing, and the busiest leaf functions.

    py-spy (without --idle) leaves out samples where the process waits, so samples / (rate x duration)
    is the share of the recorded time the process was on the CPU (`busy`).
    """
    sched_rules, out_rules = rules(SCHED_FUNCS, engine), rules(OUTPUT_FUNCS, engine)
    total = sched = output = 0
    leaves: Counter[str] = Counter()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            if any(_hit(f, sched_rules) for f in frames):
                sched += n
            elif any(_hit(f, out_rules) for f in frames):
                output += n
            leaves[frames[-1]] += n
    expected = rate_hz * duration_s if rate_hz and duration_s else None
    return {
        "samples": total,
        "busy": round(min(total / expected, 1.0), 4) if expected else None,
        "sched_samples": sched,
        "sched_share": round(sched / total, 4) if total else None,
        "output_samples": output,
        "output_share": round(output / total, 4) if total else None,
        "top_leaves": [{"frame": f, "samples": n} for f, n in leaves.most_common(5)],
        "functions": {"scheduling": SCHED_FUNCS[engine], "output": OUTPUT_FUNCS[engine]},
    }
