"""Per-host OpenSSH servers for the rig: keys, config, start inside a namespace, known_hosts.

Each rig host runs its own `/usr/sbin/sshd -D -f <config>` bound to its namespace address, with its own
host key. The controller logs in as root with a throwaway ed25519 key; host key checking stays on because
the rig writes the exact known_hosts the inventory points at.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .netns import ip_binary

SSHD = "/usr/sbin/sshd"


class SshdError(RuntimeError):
    """sshd could not be configured or did not come up; the message says which host and why."""


def sshd_binary() -> str:
    """Path of sshd, or raise naming the installer script."""
    if os.access(SSHD, os.X_OK):
        return SSHD
    found = shutil.which("sshd")
    if not found:
        raise SshdError("sshd not found: run tests/rig/install_system_deps.sh (Debian openssh-server)")
    return found


def keygen(path: Path, comment: str) -> str:
    """Create an ed25519 key pair at `path` (no passphrase); return the public key line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path.with_suffix(".pub").read_text().strip()


def write_config(
    host_dir: Path, address: str, authorized_key: str, path_prefix: str, host_name: str
) -> tuple[Path, str]:
    """Write host key, authorized_keys and sshd_config under `host_dir/ssh`; return (config, host pubkey)."""
    ssh_dir = host_dir / "ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    host_key = ssh_dir / "ssh_host_ed25519_key"
    host_pub = keygen(host_key, f"qm-rig-{host_name}")
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(authorized_key + "\n")
    authorized.chmod(0o600)
    path = f"{path_prefix}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    config = ssh_dir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {address}",
                "Port 22",
                f"HostKey {host_key}",
                f"PidFile {ssh_dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                # Ansible opens several sessions per master connection; forks and pipelining need room.
                "MaxSessions 64",
                "MaxStartups 64:30:128",
                "UseDNS no",
                "PrintMotd no",
                "LogLevel INFO",
                # The docker shim is first on PATH for every session, like a real node's docker CLI.
                # HOME is the host's own (applied after sshd's defaults): root's shell reads that home's
                # (empty) rc files instead of this machine's ~/.bashrc (pyenv init costs ~0.2 s per SSH
                # command here, which a GPU node would not charge), and ~/.ansible stays per host.
                f"SetEnv PATH={path} HOME={host_dir / 'home'} QM_RIG_HOST={host_name}",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    return config, host_pub


def start(ns: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start sshd in the foreground inside namespace `ns`; `ip netns exec` execs, so the PID is sshd's."""
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory
    check = subprocess.run([sshd_binary(), "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        raise SshdError(f"sshd rejected {config}: {check.stderr.strip()}")
    return subprocess.Popen(
        [ip_binary(), "netns", "exec", ns, sshd_binary(), "-D", "-f", str(config), "-E", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_listening(address: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 10.0) -> None:
    """Block until `address:22` accepts TCP from the controller; raise with sshd's log when it dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text() if log.exists() else ""
            raise SshdError(f"sshd for {address} exited with {proc.returncode}: {text.strip()[-500:]}")
        try:
            with socket.create_connection((address, 22), timeout=0.5) as sock:
                if sock.recv(4).startswith(b"SSH"):
                    return
        except OSError:
            time.sleep(0.05)
    raise SshdError(f"sshd for {address} did not accept connections within {timeout_s} s")


def known_hosts_line(address: str, host_pub: str) -> str:
    """A known_hosts entry for port 22 (`addr keytype base64`)."""
    keytype, blob = host_pub.split()[:2]
    return f"{address} {keytype} {blob}"
