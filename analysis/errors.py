"""One error type for bad input, so every subcommand fails the same way: exit 2, one line.

The message always names the file, then the line or field, then what was expected, because the
person reading it is usually looking at an Ansible task failure and needs to know what to fix.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Malformed or missing input. The CLI prints ``str(err)`` on one line and exits 2."""

    def __init__(self, path: str | Path | None, where: str | None, expected: str) -> None:
        self.path = str(path) if path is not None else None
        self.where = where
        self.expected = expected
        parts = [p for p in (self.path, where) if p]
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {expected}" if prefix else expected)
