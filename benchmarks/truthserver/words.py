"""The words truthserver streams, one token each, and the byte layout that makes any run of them a slice.

The same list feeds the tokenizer directory (``tokdir.py``), so a client that re-encodes the streamed
text with that tokenizer counts exactly one token per streamed word.
"""

from __future__ import annotations

import itertools
import random

# consonant + vowel syllables: lowercase ASCII words that no JSON escaping or tokenizer splitting touches
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
N_WORDS = 4000
SEED = 20261202


def stream_words(n: int = N_WORDS, seed: int = SEED) -> list[str]:
    """``n`` distinct 2- and 3-syllable words in a fixed, seeded order (the same list on every host)."""
    sylls = [c + v for c in _CONSONANTS for v in _VOWELS]
    words = ["".join(p) for k in (2, 3) for p in itertools.product(sylls, repeat=k)]
    random.Random(seed).shuffle(words)
    return words[:n]


class WordText:
    """Word k of a stream is ``words[k % len(words)]``; all of them live in one byte string.

    ``span(a, count)`` is the text of words a .. a+count-1 joined by single spaces: one slice of a
    prebuilt buffer (C memcpy), not a join per event. The buffer grows when a longer run is asked for.
    """

    def __init__(self, words: list[str]) -> None:
        self.words = [w.encode() for w in words]
        self.text = b""
        self.off: list[int] = [0]
        self._grow(2 * len(self.words))

    def _grow(self, n_words: int) -> None:
        have = len(self.off) - 1
        if n_words <= have:
            return
        nw = len(self.words)
        parts = [self.words[k % nw] for k in range(have, n_words)]
        off = self.off
        pos = off[-1]
        for w in parts:
            pos += len(w) + 1
            off.append(pos)
        self.text += b" ".join(parts) + b" "

    def span(self, start: int, count: int) -> bytes:
        """Words ``start .. start+count-1`` (count >= 1) joined by single spaces."""
        end = start + count
        if end >= len(self.off):
            self._grow(max(end + 1, 2 * (len(self.off) - 1)))
        return self.text[self.off[start] : self.off[end] - 1]

    def span_after_space(self, start: int, count: int) -> bytes:
        """The same words with the space before them (start >= 1): the text of a later stream event."""
        end = start + count
        if end >= len(self.off):
            self._grow(max(end + 1, 2 * (len(self.off) - 1)))
        return self.text[self.off[start] - 1 : self.off[end] - 1]
