"""The runs of the quantization-matrix lab: the same workloads at batch 1 and at saturation, on random
tokens and on a ShareGPT-shaped prompt set, for every format variant.

Why both loads: a format's gain splits into per-token compute (visible at batch 1, where decoding
reads every weight once per token) and batch or KV capacity (visible only at saturation), so each
variant is measured at both, on exact-length random prompts and on a conversational length mix.
Pure: the caller's run collector (plan._Runs) receives the runs and the generated dataset.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, Protocol

from analysis.errors import InputError
from analysis.labs.client_args import random_dataset

# Words of the generated ShareGPT-shaped prompts (ordinary English: every tokenizer splits them).
_WORDS = (
    "the model serves requests from many users and each answer depends on the question asked "
    "before it so a short reply may follow a long prompt or a long story may follow one line of "
    "text while the server keeps every conversation apart"
)

_VOCAB = _WORDS.split()
_TASK = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class RunSink(Protocol):
    seed: int

    def add(self, name: str, workload: dict[str, Any], data: list[str], **kw: Any) -> None: ...

    def dataset(self, name: str, lines: list[dict[str, Any]]) -> str: ...


def _int(w: dict[str, Any], key: str, where: str, minimum: int = 1) -> int:
    v = w.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise InputError(None, f"{where}.{key}", f"got {v!r}, expected an integer >= {minimum}")
    return v


def _lognormal_len(rng: random.Random, median: int, lo: int, hi: int) -> int:
    """A length drawn like conversational data: log-normal around the median (sigma 0.8), clipped."""
    return int(min(max(round(median * math.exp(rng.gauss(0.0, 0.8))), lo), hi))


def shaped_rows(n: int, median_words: int, median_osl: int, max_osl: int, seed: int) -> list[dict[str, Any]]:
    """ShareGPT-shaped prompts: text of log-normal word counts, each with its own output length."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = _lognormal_len(rng, median_words, 8, 8 * median_words)
        text = " ".join(rng.choice(_VOCAB) for _ in range(words))
        rows.append({"prompt": text, "output_len": _lognormal_len(rng, median_osl, 4, max_osl)})
    return rows


def plan(r: RunSink, w: dict[str, Any], where: str) -> None:
    """Four runs per variant: random and ShareGPT-shaped, each at batch 1 and at saturation."""
    isl, osl = _int(w, "isl", where), _int(w, "osl", where)
    b1 = _int(w, "batch1_prompts", where)
    sat_c, sat_n = _int(w, "saturation_concurrency", where), _int(w, "saturation_prompts", where)
    warm = _int(w, "warmup", where, minimum=0)
    if sat_c < 2:
        raise InputError(
            None, f"{where}.saturation_concurrency", f"got {sat_c}, expected >= 2 (batch 1 is run apart)"
        )
    random_args = random_dataset(isl, osl)
    loads = (("c1", 1, b1), ("sat", sat_c, sat_n))
    for tag, c, n in loads:
        wl = {"dataset": "random", "isl": isl, "osl": osl, "concurrency": c, "num_prompts": n, "warmup": warm}
        r.add(f"random_{tag}", wl, random_args, expect_output_len=osl)
    tasks = w.get("eval_tasks", [])
    if not isinstance(tasks, list) or not all(isinstance(t, str) and _TASK.fullmatch(t) for t in tasks):
        raise InputError(None, f"{where}.eval_tasks", f"got {tasks!r}, expected a list of lm_eval task names")
    path = w.get("sharegpt_path", "") or ""
    if not isinstance(path, str):
        raise InputError(None, f"{where}.sharegpt_path", f"got {path!r}, expected a file path or ''")
    if path:
        data = ["--dataset-name", "sharegpt", "--dataset-path", path]
        min_osl, label = 1, f"sharegpt ({path})"
    else:
        n_rows = max(b1, sat_n)
        rows = shaped_rows(
            n_rows,
            _int(w, "shaped_median_words", where),
            _int(w, "shaped_median_osl", where),
            _int(w, "shaped_max_osl", where, minimum=4),
            r.seed,
        )
        data = ["--dataset-name", "jsonl", "--dataset-path", r.dataset("sharegpt_shaped", rows)]
        min_osl, label = (
            min(row["output_len"] for row in rows),
            "sharegpt-shaped (generated, log-normal lengths)",
        )
    for tag, c, n in loads:
        wl = {"dataset": label, "concurrency": c, "num_prompts": n, "warmup": warm}
        r.add(f"sharegpt_{tag}", wl, data, expect_output_len=min_osl)
