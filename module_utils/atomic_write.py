# Copyright: quickmap contributors
# Apache-2.0
"""Atomic file writes for modules: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the destination's own directory (same filesystem, so ``os.replace`` is a
rename), fsync it, then replace. A crash or Ctrl-C in between leaves at most a stray ``.tmp`` file that
is removed on the error path.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644, make_dirs: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; create the parent directory when ``make_dirs``."""
    directory = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str, mode: int = 0o644, make_dirs: bool = True) -> None:
    """UTF-8 text variant of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, make_dirs=make_dirs)


def atomic_write_json(path: str, obj: object, mode: int = 0o644, make_dirs: bool = True) -> None:
    """Write ``obj`` as indented, key-sorted JSON (stable diffs between runs) plus a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode=mode, make_dirs=make_dirs)
