"""The emulated language model (deterministic output tokens) and the NGRAM drafter.

Why: speculative decoding gains must come from drafts that really match the continuation. The model
behaves like an induction-heavy LM: it copies spans of its context, and how long it keeps copying a
span depends on how repetitive the prompt is (a repetitive prompt is continued almost verbatim; on
ordinary text it jumps to a new prompt position or emits a fresh word about every other token).
The NGRAM drafter knows nothing of this: it looks the context's suffix up in an n-gram index and
proposes what followed the most recent earlier occurrence, exactly like prompt-lookup decoding.
"""

from __future__ import annotations

import math
import random

_INDEX_MAX_N = 4  # longest n-gram the drafter indexes (longer windows fall back to this)


def seed_of(tokens: list[int], salt: int) -> int:
    """A seed from the prompt (first/last 64 ids and the length), so equal requests give equal outputs."""
    mask = (1 << 64) - 1
    h = (len(tokens) * 0x9E3779B97F4A7C15 + salt) & mask
    for t in tokens[:64] + tokens[-64:]:
        h = ((h ^ t) * 0x100000001B3) & mask
    return h


def repetitiveness(tokens: list[int]) -> float:
    """Share of the last 2,048 prompt trigrams that already occurred earlier (0 = novel, ~1 = looping)."""
    sample = tokens[-2048:]
    n = len(sample) - 2
    if n <= 0:
        return 0.0
    seen = set()
    repeats = 0
    for i in range(n):
        key = (sample[i], sample[i + 1], sample[i + 2])
        if key in seen:
            repeats += 1
        else:
            seen.add(key)
    return repeats / n


class EmulatedLM:
    """Per-request generator state. `ctx` is shared with the request (prompt + outputs so far)."""

    __slots__ = ("ctx", "p_stay", "prompt_len", "ptr", "rng", "vocab")

    def __init__(self, ctx: list[int], vocab: int, seed: int) -> None:
        self.ctx = ctx
        self.prompt_len = len(ctx)
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.ptr = -1
        self.p_stay = 0.5 + 0.47 * repetitiveness(ctx)

    def next_token(self) -> int:
        """The model's next token for the current context (does not append it)."""
        ptr = self.ptr
        if ptr >= 0 and self.rng.random() < self.p_stay:
            self.ptr = ptr + 1
            return self.ctx[ptr]
        return self.jump()

    def jump(self) -> int:
        """Leave the current span: copy from a random prompt position, or emit a fresh word."""
        rnd = self.rng.random
        if self.prompt_len and rnd() < 0.5:
            j = int(rnd() * self.prompt_len)
            self.ptr = j + 1
            return self.ctx[j]
        self.ptr = -1
        return 256 + int(rnd() * (self.vocab - 256)) if self.vocab > 256 else 32

    def natural_length(self, mean: float = 256.0) -> int:
        """Where the model would emit EOS if the request does not ignore it (exponential draw)."""
        u = max(self.rng.random(), 1e-12)
        return 1 + int(-mean * math.log(u))


class NgramDrafter:
    """Prompt-lookup drafter: suffix n-gram (longest first) -> tokens after its last earlier occurrence."""

    __slots__ = ("ctx", "index", "indexed", "max_n", "min_n")

    def __init__(self, ctx: list[int], min_n: int, max_n: int) -> None:
        self.ctx = ctx
        self.max_n = max(1, min(max_n, _INDEX_MAX_N))
        self.min_n = max(1, min(min_n, self.max_n))
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # continuation positions < indexed are in the index
        self.catch_up()

    def catch_up(self) -> None:
        """Index every n-gram that has at least one token after it (so the live suffix is excluded)."""
        ctx = self.ctx
        idx = self.index
        end = len(ctx)
        for p in range(max(1, self.indexed), end):
            for n in range(1, min(self.max_n, p) + 1):
                idx[tuple(ctx[p - n : p])] = p
        self.indexed = max(self.indexed, end)

    def propose(self, k: int) -> list[int]:
        self.catch_up()
        ctx = self.ctx
        for n in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            p = self.index.get(tuple(ctx[-n:]))
            if p is not None:
                return ctx[p : p + k]
        return []
