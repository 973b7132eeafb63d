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
    if not paramiko:
        # OpenSSH multiplexing is on, confined to this rig's ControlPath dir (teardown closes them).
        sockets = [p for p in rig.control_path_dir.iterdir() if p.is_socket()]
        assert len(sockets) >= len(rig.hosts)


@pytest.mark.parametrize("paramiko", PLUGINS)
def test_round_trip_and_host_identity(
    ansible: AnsibleRunner, rig: Rig, paramiko: bool, tmp_path: Path
) -> None:
    """copy to each host's own work dir, change it there, fetch it back (the bytes make the whole trip);
    the same session is inside the host's namespace, finds the docker shim first on PATH, has the host's
    own HOME, and reaches the head over the bridge (what the engines' TCP rendezvous needs)."""
    payload = os.urandom(200_000)
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    name = f"roundtrip-{'paramiko' if paramiko else 'openssh'}.bin"
    fetched = tmp_path / "fetched"
    extra = {"rig_smoke_src": str(src), "rig_smoke_name": name, "rig_smoke_fetch_dir": str(fetched)}
    cmd = ["-e", json.dumps(extra), *(["-c", "paramiko_ssh"] if paramiko else [])]
    proc = ansible.playbook(str(Path(__file__).with_name("playbooks") / "smoke.yml"), *cmd, paramiko=paramiko)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    head = rig.host("head")
    for host in rig.hosts:
        assert (host.work_dir / name).read_bytes() == payload + host.name.encode()  # its own dir only
        assert (fetched / f"{host.name}.bin").read_bytes() == payload + host.name.encode()
        said = (fetched / f"{host.name}.txt").read_text()
        assert re.search(rf"eth0\s+inet {re.escape(host.address)}/24", said), said
        assert re.search(rf"eth3\s+inet {re.escape(host.rail2_address)}/24", said), said
        others = [h.address for h in rig.hosts if h is not host]
        assert not any(f"inet {addr}/" in said for addr in others), said
        assert f"DOCKER={host.bin_dir / 'docker'}" in said
        assert f"HOME={host.path / 'home'} HOST={host.name}" in said
        assert f"HEAD_REACHED={head.address}" in said


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
