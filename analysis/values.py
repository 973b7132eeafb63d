"""Coercing loosely typed JSON values (meta.json written by roles, numbers clients wrote as floats)."""

from __future__ import annotations

import math
from typing import Any


def as_int(value: Any) -> int | None:
    """Integer value of a JSON number (or numeric string); None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None
