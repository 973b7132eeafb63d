"""Deterministic word-level tokeniser shipped with the emulator.

Why: clients must be able to send token ids and text interchangeably and get exact counts back,
without a Hugging Face download. Ids 0..255 are single UTF-8 bytes; every id from 256 up to the
model's vocabulary size is the word " " + W(id - 256), where W(n) is the n-th lowercase string in
bijective base-26 order ("a", "b", ..., "z", "aa", ..., "zzz", "aaaa", ...). Encoding is greedy:
" " followed by up to four lowercase letters becomes one word token when that word is in the
vocabulary, everything else is byte tokens. Any id below the vocabulary size is accepted.

Round trips: text -> ids -> text is exact for any text; ids -> text -> ids is exact for any
sequence of word ids (and bytes that do not spell a word next to a word).
"""

from __future__ import annotations

import re

_WORD_RE = re.compile(r" [a-z]{1,4}|[^ ]+| ")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _word(n: int) -> str:
    """The n-th (0-based) string in bijective base-26 order."""
    n += 1
    out = []
    while n > 0:
        n -= 1
        n, r = divmod(n, 26)
        out.append(_LETTERS[r])
    return "".join(reversed(out))


class Tokenizer:
    """Word-level tokeniser for a vocabulary of `vocab_size` ids (>= 257)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        n_words = max(0, vocab_size - 256)
        self._strs: list[str] = [chr(i) if i < 128 else "\ufffd" for i in range(min(256, vocab_size))]
        self._strs.extend(" " + _word(i) for i in range(n_words))
        self._ids: dict[str, int] = {self._strs[i]: i for i in range(256, vocab_size)}

    def token_str(self, tid: int) -> str:
        """Text of one token for streaming (bytes >= 128 show as U+FFFD on their own)."""
        return self._strs[tid]

    def encode(self, text: str) -> list[int]:
        """Text -> ids (greedy; never fails)."""
        ids: list[int] = []
        lookup = self._ids
        for piece in _WORD_RE.findall(text):
            if piece[0] == " " and len(piece) > 1 and piece[1] in _LETTERS:
                # try the longest word first, then shorter ones; leftover letters become bytes
                for k in range(len(piece), 1, -1):
                    tid = lookup.get(piece[:k])
                    if tid is not None:
                        ids.append(tid)
                        ids.extend(piece[k:].encode())
                        break
                else:
                    ids.extend(piece.encode())
            else:
                ids.extend(piece.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; byte tokens are joined and decoded as UTF-8 (invalid bytes become U+FFFD)."""
        out: list[str] = []
        pending = bytearray()
        strs = self._strs
        for tid in ids:
            if tid < 256:
                pending.append(tid)
                continue
            if pending:
                out.append(pending.decode("utf-8", "replace"))
                pending.clear()
            out.append(strs[tid])
        if pending:
            out.append(pending.decode("utf-8", "replace"))
        return "".join(out)

    def stream_text(self, ids: list[int]) -> str:
        """Cheap per-token join used on the streaming hot path."""
        strs = self._strs
        return "".join([strs[t] for t in ids])
