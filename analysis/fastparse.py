"""Decode a result document with its big per-token ``itls`` array parsed straight into numpy.

Why: an SGLang ``--output-details`` line of 10,000 requests × 32 ITLs is ~7 MB, almost all of it
the ``itls`` list of lists. A plain ``orjson.loads`` turns it into 320,000 Python floats in
10,000 lists, which ``readers.ragged`` then flattens again; about half of that cost is the
kernel handing fresh pages to the allocator (the float objects fill pymalloc arenas that are
unmapped again when the list dies, so every file faults them in anew).

How: the top-level ``itls`` value is cut out of the document and parsed in ~32 KiB chunks of
whole rows. Each chunk goes through orjson (the same number parser as the full decode) and is
flattened into a small numpy array before the next chunk is parsed, so the same few hundred KB of
allocator memory is reused and no page is faulted in. The rest of the document, with ``itls``
replaced by a placeholder string, goes through :func:`analysis.rawload.parse_json_bytes` as before.

It never gives a different answer from the full decode: it returns a result only when every
chunk parsed as a list of lists of numbers, the separators between chunks are exactly one comma
(plus JSON whitespace), and the rest of the document parsed with the placeholder as the value of
the top-level ``itls`` key (the placeholder does not occur in the input, so the parser itself
confirmed the cut was that value). A JSON value can be swapped for another value without changing
how the rest of the document parses, so the original document parses to the same object with the
chunks' rows as ``itls``. In any other case (``Infinity``/``NaN`` that only the stdlib accepts,
whitespace-only rows, a nested key called ``itls``, truncation…) it falls back to the full parse,
which also produces the error message with the original line and column.
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any

import numpy as np
import orjson

from analysis.rawload import parse_json_bytes

KEY = b'"itls"'
PLACEHOLDER = "__qm_fast_itls__"
_PLACEHOLDER_JSON = b'"' + PLACEHOLDER.encode() + b'"'
_WS = b" \t\r\n"
_CHUNK = 1 << 15  # bytes of row text per orjson call: its floats fit in one pymalloc arena


class Ragged:
    """A list of lists of numbers as (flat float64 values, per-row lengths)."""

    __slots__ = ("flat", "lens")

    def __init__(self, flat: np.ndarray, lens: np.ndarray) -> None:
        self.flat = flat
        self.lens = lens

    def __len__(self) -> int:
        return len(self.lens)

    def all_finite(self) -> bool:
        """No NaN or Infinity among the values (the case verdict's non-finite rule)."""
        return bool(np.isfinite(self.flat).all())

    def tolist(self) -> list[list[float]]:
        """The rows as Python lists (tests and debugging; not used on the hot path)."""
        ends = np.cumsum(self.lens)
        return [self.flat[e - n : e].tolist() for e, n in zip(ends.tolist(), self.lens.tolist(), strict=True)]


def _loads_rows(text: bytes) -> list[Any] | None:
    """One chunk ``[row, row, …]``: orjson, or the stdlib for Python's Infinity/NaN tokens."""
    try:
        rows = orjson.loads(text)
    except orjson.JSONDecodeError:
        if b"N" not in text and b"I" not in text:
            return None
        try:
            rows = json.loads(text)  # accepts exactly Infinity, -Infinity and NaN beyond JSON
        except ValueError:
            return None
    return rows if isinstance(rows, list) else None


def parse_ragged(buf: bytes, start: int, stop: int, chunk: int = _CHUNK) -> Ragged | None:
    """Parse ``buf[start:stop]``, which must be exactly one JSON array of arrays of numbers.

    Returns None (never raises) when it is not, or not in a form this parser takes.
    """
    if stop - start < 2 or buf[start] != 0x5B or buf[stop - 1] != 0x5D:  # "[" … "]"
        return None
    if buf.find(b"l", start, stop) >= 0 or buf.find(b"u", start, stop) >= 0:
        # true/false/null (an "l" or a "u"; Infinity and NaN have neither): only numbers come
        # back from here, the full decode decides what the others mean, as it always did.
        return None
    view = memoryview(buf)
    end = stop - 1  # the outer "]"
    s = start + 1
    flats: list[np.ndarray] = []
    lens_parts: list[np.ndarray] = []
    first = True
    while True:
        close = buf.find(b"]", s + chunk, end) if s + chunk < end else -1
        comma = buf.find(b",", close + 1, end) if close >= 0 else -1
        if comma < 0:
            piece_end = end  # the last chunk runs to the outer "]" (trailing whitespace included)
        else:
            if comma > close + 1 and buf[close + 1 : comma].strip(_WS):
                return None  # something other than whitespace between a row and its comma
            piece_end = close + 1
        rows = _loads_rows(b"".join((b"[", view[s:piece_end], b"]")))
        if rows is None or (not rows and not (first and comma < 0)):
            return None  # a chunk after a comma must hold a row: "[[1],]" is not JSON
        try:
            lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            n = int(lens.sum())
            flats.append(np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=n))
        except (TypeError, ValueError):
            return None  # a row that is not a list, or a value that is not a number
        lens_parts.append(lens)
        if comma < 0:
            break
        s = comma + 1
        first = False
    if len(flats) == 1:
        return Ragged(flats[0], lens_parts[0])
    return Ragged(np.concatenate(flats), np.concatenate(lens_parts))


def find_array(data: bytes, key: bytes = KEY) -> tuple[int, int] | None:
    """(start, stop) of the array after the first ``"key":`` — a candidate, checked later.

    A list of lists of numbers holds neither ``"`` nor ``}``, so its closing bracket is the last
    ``]`` before the next of those; if the guess is wrong, parsing the cut fails.
    """
    i = data.find(key)
    if i < 0:
        return None
    n = len(data)
    j = i + len(key)
    while j < n and data[j] in _WS:
        j += 1
    if j >= n or data[j] != 0x3A:  # ":"
        return None
    j += 1
    while j < n and data[j] in _WS:
        j += 1
    if j >= n or data[j] != 0x5B:  # "["
        return None
    limit = n
    for stopper in (b'"', b"}"):
        k = data.find(stopper, j)
        if 0 <= k < limit:
            limit = k
    z = data.rfind(b"]", j, limit)
    return (j, z + 1) if z > j else None


def parse_document(data: bytes) -> Any:
    """Same result as :func:`parse_json_bytes`, except that a top-level ``itls`` list of lists
    comes back as a :class:`Ragged`. Raises ValueError exactly when ``parse_json_bytes`` does."""
    span = find_array(data)
    if span is None:
        return parse_json_bytes(data)
    start, stop = span
    if data.find(_PLACEHOLDER_JSON, 0, start) >= 0 or data.find(_PLACEHOLDER_JSON, stop) >= 0:
        return parse_json_bytes(data)  # the placeholder must be ours alone
    itls = parse_ragged(data, start, stop)
    if itls is None:
        return parse_json_bytes(data)
    view = memoryview(data)
    try:
        obj = parse_json_bytes(b"".join((view[:start], _PLACEHOLDER_JSON, view[stop:])))
    except ValueError:
        return parse_json_bytes(data)  # invalid either way; this gives the original positions
    if not isinstance(obj, dict) or obj.get("itls") != PLACEHOLDER:
        return parse_json_bytes(data)  # the cut was not the top-level itls value
    obj["itls"] = itls
    return obj
