"""The quickmap.serving collection built and installed once per test session (tools/build_collection.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import build_collection  # noqa: E402


@dataclass(frozen=True)
class Built:
    """One build: the assembled tree, the tarball, and the install of that tarball."""

    tree: Path
    tarball: Path
    install_root: Path  # what ANSIBLE_COLLECTIONS_PATH points at

    @property
    def installed(self) -> Path:
        return self.install_root / "ansible_collections" / build_collection.NAMESPACE / build_collection.NAME


@pytest.fixture(scope="session")
def built_collection(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("collection-build")
    tree = build_collection.assemble(out)
    tarball = build_collection.build(tree, out)
    install_root = tmp_path_factory.mktemp("collection-install")
    build_collection.install(tarball, install_root)
    return Built(tree=tree, tarball=tarball, install_root=install_root)
