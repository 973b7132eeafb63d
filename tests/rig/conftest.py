"""pytest fixtures for the multi-host rig: one rig per session, torn down even when tests fail."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from .ansible_cli import AnsibleRunner
from .core import Rig, cleanup_stale, unavailable_reason


@pytest.fixture(scope="session")
def rig() -> Iterator[Rig]:
    """A two-host rig (head, worker) on network namespaces; skips with the reason when it cannot exist."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"rig unavailable: {reason}")
    cleanup_stale()
    built = Rig.create()
    # A SIGTERM (CI cancel, timeout) must still run the teardown below: turn it into an exception.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        built.up()
        yield built
    finally:
        notes = built.down()
        signal.signal(signal.SIGTERM, previous)
        for note in notes:
            print(f"rig teardown: {note}")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def ansible(rig: Rig) -> AnsibleRunner:
    """Runs `ansible` / `ansible-playbook` against the rig inventory with the rig's SSH settings."""
    return AnsibleRunner(rig)
