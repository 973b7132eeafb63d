"""Atomic writes for analysis: the one implementation in ``module_utils/atomic_write.py`` (temp file in
the destination directory, fsync, ``os.replace``), with the modes and serialisation analysis wants.

A reader (or a resumed playbook) therefore sees either the old file or the new one, never a torn
one; if anything fails before the rename the temp file is removed and the old file is untouched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from analysis.errors import InputError
from module_utils.atomic_write import atomic_write_bytes


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


# mkstemp creates 0600 files; results are meant to be read by the whole team, as plain writes would be.
_PUBLIC_MODE = 0o666 & ~_umask()


def write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (creating parent directories)."""
    atomic_write_bytes(str(path), data, mode=_PUBLIC_MODE)


def write_text(path: str | Path, text: str) -> None:
    """Atomic text write (UTF-8)."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write, indented so humans can read meta/manifest files."""
    write_bytes(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def read_json_object(path: str | Path, missing_ok: bool = True) -> dict[str, Any]:
    """Read a JSON object file (meta.json, manifest.json); ``{}`` when missing and allowed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise InputError(path, None, "file not found") from None
    except OSError as exc:
        raise InputError(path, None, f"cannot read ({exc.strerror})") from None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"line {exc.lineno} column {exc.colno}", f"invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise InputError(path, None, f"expected a JSON object, got {type(obj).__name__}")
    return obj
