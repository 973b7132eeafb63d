"""Fixtures of the security suite: a sandbox with results/ and an `outside/` canary directory.

Every attack aims at `outside/` (or at running a command); the tests assert on the filesystem that
nothing there changed and that no canary file was created, whatever the playbook printed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ansible.conftest import FAST
from tests.ansible.runner import base_extravars, free_port, kill_recorded_servers, zipapp_path


def tree_digest(root: Path, skip: Path | None = None) -> dict[str, str]:
    """{relative path: sha256 (or 'dir')} of everything under ``root`` except ``skip``."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        rel = path.relative_to(root).as_posix()
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="session")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zipapp_path(tmp_path_factory.mktemp("zipapp"))


@pytest.fixture
def sandbox(tmp_path: Path, pyz: Path) -> Iterator[dict[str, Any]]:
    """results/ (the run root), outside/ (the canary dir, holding one decoy file), a free port."""
    results = tmp_path / "results"
    results.mkdir()  # as after any earlier run: results/../x then resolves, as it does for a user
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "decoy.txt").write_text("nothing may touch this directory\n")
    port = free_port()
    box = {
        "tmp": tmp_path,
        "results": results,
        "outside": outside,
        "port": port,
        "canary": tmp_path / "pwned",
        "extravars": base_extravars(results, pyz, port, **FAST),
    }
    yield box
    kill_recorded_servers(results)


def server_pid(port: int) -> int:
    """PID of the process listening on ``port`` (from /proc, independent of any record quickmap keeps)."""
    from module_utils.net_probe import probe_port

    pids = {p["pid"] for s in probe_port("127.0.0.1", port)["listeners"] for p in s["pids"]}
    assert len(pids) == 1, f"expected one server on port {port}, found {pids}"
    return pids.pop()


def assert_untouched(box: dict[str, Any], before: dict[str, str]) -> None:
    """Nothing outside results/ changed and no injected command ran."""
    assert not box["canary"].exists(), "an injected command ran"
    assert tree_digest(box["tmp"], skip=box["results"]) == before, "something was written outside results/"
