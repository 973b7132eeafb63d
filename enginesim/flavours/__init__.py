"""The engines enginesim emulates, one module each (base.py says what a flavour provides).

Every module here that defines `FLAVOUR` is an engine: adding one, or a version of one (a module whose
FLAVOUR has the same `name` replaces the older one, in module-name order), is one file. `get(name)`
finds a flavour by the engine's name (`Config.flavour`); `for_argv(argv)` by the command line after
`python -m enginesim` (`sglang ...`, `vllm serve ...`).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Flavour


def _discover() -> dict[str, Flavour]:
    found: dict[str, Flavour] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        flavour = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FLAVOUR", None)
        if isinstance(flavour, Flavour):
            found[flavour.name] = flavour
    return found


FLAVOURS: dict[str, Flavour] = _discover()


def get(name: str) -> Flavour:
    return FLAVOURS[name]


def for_argv(argv: list[str]) -> Flavour | None:
    """The flavour whose command word starts argv (`sglang`, `vllm`), or None."""
    return next((f for f in FLAVOURS.values() if argv and argv[0] == f.argv_head[0]), None)
