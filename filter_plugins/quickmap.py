# Copyright: quickmap contributors
# Apache-2.0
"""Jinja filters that apply quickmap's one secret rule (module_utils/redact.py) inside templates.

The engine templates render server commands that are saved and printed; with these filters the
values of secret flags and secret environment entries never enter the rendered text, and whatever
is shown to a person goes through the same masking as the manifest, the report and run.log.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

try:
    from module_utils import redact as _redact
except ImportError:  # a checkout run from elsewhere: the repository root holds module_utils/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from module_utils import redact as _redact


def shell_args(args: list[Any]) -> list[str]:
    """Shell-quoted words of an argv list; a secret flag's value becomes "${QUICKMAP_SECRET_<FLAG>}"."""
    return _redact.shell_args(list(args))[0]


def secret_args_env(args: list[Any]) -> dict[str, str]:
    """The environment that carries the secret flag values ``shell_args`` left out."""
    return _redact.shell_args(list(args))[1]


def public_env(env: dict[str, Any]) -> dict[str, Any]:
    """The entries of an environment mapping whose names are not secret."""
    return _redact.split_env(dict(env))[0]


def secret_env(env: dict[str, Any]) -> dict[str, Any]:
    """The entries of an environment mapping whose names are secret (HF_TOKEN, *_API_KEY, ...)."""
    return _redact.split_env(dict(env))[1]


def oneline(value: Any) -> str:
    """Text safe inside a shell comment: a line break would end the comment and start a command."""
    return str(value).replace("\r", " ").replace("\n", " ")


def redact(value: Any) -> Any:
    """Mask secrets in a string, list or mapping exactly as saved files are masked."""
    return _redact.redact(value)


_ZIP_VERSIONS: dict[tuple[str, int, int], str] = {}


def zipapp_version(path: str) -> str:
    """``loadgen <version> (sources sha256:<16 hex>)`` of the client zipapp at ``path``.

    The digest covers the Python sources only (names and contents, sorted): a rebuild of the same
    code gives the same value, although zip timestamps and compiled files differ between builds.
    """
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _ZIP_VERSIONS:
        digest = hashlib.sha256()
        version = "?"
        with zipfile.ZipFile(path) as archive:
            for name in sorted(n for n in archive.namelist() if n.endswith(".py")):
                data = archive.read(name)
                digest.update(name.encode() + b"\0" + data + b"\0")
                if name == "loadgen/__init__.py":
                    m = re.search(rb"__version__\s*=\s*[\"']([^\"']+)", data)
                    version = m.group(1).decode() if m else "?"
        _ZIP_VERSIONS[key] = f"loadgen {version} (sources sha256:{digest.hexdigest()[:16]})"
    return _ZIP_VERSIONS[key]


class FilterModule:
    """quickmap_* filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "quickmap_shell_args": shell_args,
            "quickmap_secret_args_env": secret_args_env,
            "quickmap_public_env": public_env,
            "quickmap_secret_env": secret_env,
            "quickmap_redact": redact,
            "quickmap_oneline": oneline,
            "quickmap_zipapp_version": zipapp_version,
        }
