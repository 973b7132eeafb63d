"""Shared helpers of the labs tests: the real-output fixtures, cut into their samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
sys.path.insert(0, str(HERE))


def samples(name: str) -> list[tuple[str, str]]:
    """(source line, sample text) for every `# source:` block of a fixture file, notes dropped."""
    out: list[tuple[str, list[str]]] = []
    for line in (FIXTURES / name).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("# source:"):
            out.append((line, []))
        elif out and not line.startswith("# note:"):
            out[-1][1].append(line)
    return [(src, "\n".join(lines).strip() + "\n") for src, lines in out]


def sample(name: str, source_contains: str) -> str:
    found = [text for src, text in samples(name) if source_contains in src]
    assert len(found) == 1, (name, source_contains, len(found))
    return found[0]


@pytest.fixture
def fixture_text():
    return lambda name: (FIXTURES / name).read_text(encoding="utf-8", errors="replace")
