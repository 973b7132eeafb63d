"""The rig cleans up after itself: teardown by PID, and stale rigs of crashed runs removed."""

from __future__ import annotations

import json
import subprocess

import pytest

from . import netns, procs
from .ansible_cli import AnsibleRunner
from .core import Rig, cleanup_stale, unavailable_reason

pytestmark = pytest.mark.rig


def test_teardown_and_stale_cleanup(rig: Rig) -> None:
    """A second rig with live SSH masters is removed completely once its owner is gone; ours survives."""
    extra = Rig.create().up()
    try:
        proc = AnsibleRunner(extra).adhoc("all", "ansible.builtin.ping")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        sshd_pids = [h.sshd_pid for h in extra.hosts]
        session_pids = [pid for p in sshd_pids for pid in procs.descendants(p)]
        assert session_pids, "ControlPersist should keep an sshd session per host open"
        # Pretend its owner crashed: a process that has already exited.
        dead = subprocess.Popen(["true"])
        dead.wait()
        data = json.loads((extra.path / "rig.json").read_text())
        data["owner_pid"] = dead.pid
        (extra.path / "rig.json").write_text(json.dumps(data))
        notes = cleanup_stale()
        assert f"removed stale rig {extra.rig_id}" in notes
        assert not any(h.ns in netns.list_namespaces() for h in extra.hosts)
        assert not any(extra.rig_id in link for link in netns.list_links())
        assert not any(procs.alive(pid) for pid in sshd_pids + session_pids)
        assert not extra.path.exists()
        # The session's rig (its owner, this pytest process, is alive) is untouched.
        assert all(h.ns in netns.list_namespaces() for h in rig.hosts)
        assert all(procs.alive(h.sshd_pid) for h in rig.hosts)
    finally:
        extra.down()


def test_without_root_the_rig_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reason the rig tests skip with when namespaces cannot be created (CI without root)."""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert unavailable_reason() == "the rig needs root to create network namespaces (not root here)"
