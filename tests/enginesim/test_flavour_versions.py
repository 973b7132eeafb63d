"""An engine version is one file in enginesim/flavours: it becomes the engine's default and the
version it follows stays selectable by (name, version)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from enginesim import flavours

NEXT = """
from enginesim.flavours.sglang import SGLang


class SGLangNext(SGLang):
    version = "9.9.9"


FLAVOUR = SGLangNext()
"""


def test_a_version_file_becomes_the_default_and_keeps_the_older(tmp_path: Path, monkeypatch) -> None:
    old = flavours.get("sglang")
    (tmp_path / "sglang_zz_next.py").write_text(NEXT)
    monkeypatch.setattr(flavours, "__path__", [*flavours.__path__, str(tmp_path)])
    try:
        versions = flavours._discover()
    finally:
        sys.modules.pop("enginesim.flavours.sglang_zz_next", None)
    assert versions["sglang"][old.version] is old
    assert list(versions["sglang"])[-1] == "9.9.9"
    assert set(versions) == set(flavours.FLAVOURS)


def test_get_by_version_and_a_clear_error_for_an_unknown_one() -> None:
    for name, fl in flavours.FLAVOURS.items():
        assert flavours.get(name, fl.version) is fl is flavours.get(name)
    with pytest.raises(KeyError, match=r"'sglang'.*'0\.0\.1'.*known: "):
        flavours.get("sglang", "0.0.1")
