"""Smoke path of the rig: real SSH into two namespaced hosts over OpenSSH and over paramiko.

These do not depend on the roles: they prove the rig itself (addresses, sshd, keys, host key checking,
file transfer both ways, the docker shim on PATH) before the playbook tests build on it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from .ansible_cli import AnsibleRunner
from .core import Rig

pytestmark = pytest.mark.rig

PLUGINS = [pytest.param(False, id="openssh"), pytest.param(True, id="paramiko")]


def host_results(stdout: str) -> dict[str, str]:
    """`host | STATUS ...` lines of ad-hoc output -> {host: STATUS}."""
    return dict(re.findall(r"^(\S+) \| (SUCCESS|CHANGED|FAILED!?|UNREACHABLE!?)", stdout, re.M))


@pytest.mark.parametrize("paramiko", PLUGINS)
def test_ping_reaches_both_hosts(ansible: AnsibleRunner, rig: Rig, paramiko: bool) -> None:
    proc = ansible.adhoc("all", "ansible.builtin.ping", paramiko=paramiko)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert host_results(proc.stdout) == {h.name: "SUCCESS" for h in rig.hosts}


@pytest.mark.parametrize("paramiko", PLUGINS)
def test_each_host_is_its_own_namespace(ansible: AnsibleRunner, rig: Rig, paramiko: bool) -> None:
    """The session lands in the host's namespace: its own eth0 and eth3 addresses, the docker shim."""
    script = "ip -4 -o addr show; command -v docker; echo HOST=$QM_RIG_HOST"
    proc = ansible.adhoc("all", "ansible.builtin.shell", script, "-o", paramiko=paramiko)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in rig.hosts:
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"{host.name} |"))
        assert re.search(rf"eth0\s+inet {re.escape(host.address)}/24", line), line
        assert f"inet {host.rail2_address}/24" in line, line
        others = [h.address for h in rig.hosts if h is not host]
        assert not any(f"inet {addr}/" in line for addr in others), line
        assert str(host.bin_dir / "docker") in line, line
        assert f"HOST={host.name}" in line, line


@pytest.mark.parametrize("paramiko", PLUGINS)
def test_file_round_trip(ansible: AnsibleRunner, rig: Rig, paramiko: bool, tmp_path: Path) -> None:
    """copy to each host's own work dir, change it there, fetch it back: the bytes make the whole trip."""
    payload = os.urandom(200_000)
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    name = f"roundtrip-{'paramiko' if paramiko else 'openssh'}.bin"
    dest = "{{ quickmap_node_results_dir }}/" + name
    proc = ansible.adhoc("all", "ansible.builtin.copy", f"src={src} dest={dest} mode=0644", paramiko=paramiko)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in rig.hosts:
        assert (host.work_dir / name).read_bytes() == payload  # landed in that host's dir, nowhere else
    proc = ansible.adhoc(
        "all",
        "ansible.builtin.shell",
        f"printf '%s' {{{{ inventory_hostname }}}} >> {dest}",
        paramiko=paramiko,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fetched = tmp_path / "fetched"
    proc = ansible.adhoc("all", "ansible.builtin.fetch", f"src={dest} dest={fetched}/", paramiko=paramiko)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host in rig.hosts:
        got = fetched / host.name / str(host.work_dir / name).lstrip("/")
        assert got.read_bytes() == payload + host.name.encode()


@pytest.mark.parametrize("paramiko", PLUGINS)
def test_host_key_checking_is_on(ansible: AnsibleRunner, rig: Rig, paramiko: bool, tmp_path: Path) -> None:
    """Without the rig's known_hosts the connection is refused, so the rig really checks host keys."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(tmp_path / "cp")}  # no reuse of an authenticated master
    if paramiko:
        (tmp_path / "home" / ".ssh").mkdir(parents=True)
        (tmp_path / "home" / ".ssh" / "known_hosts").write_text("")
        env["HOME"] = str(tmp_path / "home")
    common = f"-o UserKnownHostsFile={empty} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    override = json.dumps({"ansible_ssh_common_args": common})
    worker = rig.host("worker").name
    proc = ansible.adhoc(worker, "ansible.builtin.ping", "", "-e", override, paramiko=paramiko, env=env)
    assert proc.returncode != 0
    assert host_results(proc.stdout).get(rig.host("worker").name, "").startswith("UNREACHABLE"), proc.stdout
    # OpenSSH: "Host key verification failed"; paramiko asks to accept the unknown key, and cannot.
    refused = r"Host key verification failed|not found in known_hosts|stdin is not interactive"
    assert re.search(refused, proc.stdout), proc.stdout


def test_worker_reaches_head_over_the_bridge(ansible: AnsibleRunner, rig: Rig) -> None:
    """The two hosts talk to each other directly (what the engines' TCP rendezvous needs), on both rails."""
    head = rig.host("head")
    probe = (
        '/usr/bin/python3 -c "import socket,sys; '
        "[socket.create_connection((a, 22), timeout=3).close() for a in sys.argv[1:]]; print('reached')\" "
        f"{head.address}"
    )
    proc = ansible.adhoc(rig.host("worker").name, "ansible.builtin.shell", probe)
    assert proc.returncode == 0 and "reached" in proc.stdout, proc.stdout + proc.stderr


def test_controlpersist_masters_live_in_the_rig_dir(ansible: AnsibleRunner, rig: Rig) -> None:
    """OpenSSH multiplexing is on and confined to this rig's ControlPath dir (teardown closes them)."""
    proc = ansible.adhoc("all", "ansible.builtin.ping")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sockets = [p for p in rig.control_path_dir.iterdir() if p.is_socket()]
    assert len(sockets) >= len(rig.hosts)
