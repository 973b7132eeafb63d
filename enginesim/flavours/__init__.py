"""The engines enginesim emulates, one module each (base.py says what a flavour provides).

Every module here that defines `FLAVOUR` is an engine or a version of one: adding either is one file.
Each (name, version) pair is kept (`VERSIONS`); for a name, the module last in module-name order is
the default (`FLAVOURS`), so a newer version's file, named to sort after the older one, takes over
without the older one being lost. `get(name)` finds the default flavour by the engine's name
(`Config.flavour`), `get(name, version)` a given version; `for_argv(argv)` the default by the command
line after `python -m enginesim` (`sglang ...`, `vllm serve ...`).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Flavour


def _discover() -> dict[str, dict[str, Flavour]]:
    found: dict[str, dict[str, Flavour]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        flavour = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FLAVOUR", None)
        if isinstance(flavour, Flavour):
            versions = found.setdefault(flavour.name, {})
            versions.pop(flavour.version, None)  # re-inserted last: the newest file is the default
            versions[flavour.version] = flavour
    return found


VERSIONS: dict[str, dict[str, Flavour]] = _discover()
FLAVOURS: dict[str, Flavour] = {name: list(v.values())[-1] for name, v in VERSIONS.items()}


def get(name: str, version: str = "") -> Flavour:
    """The flavour of engine `name`: the given version, else the default. KeyError names what exists."""
    if not version:
        return FLAVOURS[name]
    try:
        return VERSIONS[name][version]
    except KeyError:
        known = ", ".join(sorted(VERSIONS.get(name, {}))) or "none"
        raise KeyError(f"no {name!r} flavour of version {version!r} (known: {known})") from None


def for_argv(argv: list[str]) -> Flavour | None:
    """The default flavour whose command word starts argv (`sglang`, `vllm`), or None."""
    return next((f for f in FLAVOURS.values() if argv and argv[0] == f.argv_head[0]), None)
