"""The two-host rig: namespaces on a bridge, one sshd each, per-host dirs, docker shim, teardown.

`Rig.up()` builds everything and writes `rig.json` into the rig dir; `Rig.down()` (also
`teardown_dir(path)` for a rig found on disk) removes it again: SSH masters closed, sshd and its children
ended by PID, the shim's engines ended by their recorded PIDs, namespaces and bridges deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import netns, procs, sshd

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
RIG_ROOT = Path(os.environ.get("QM_RIG_ROOT", "/tmp"))
DIR_PREFIX = "qm-rig-"
# Held while a rig picks its subnet and builds, and while stale rigs are removed: parallel pytest workers
# (xdist) and other checkouts then never pick the same /24 nor remove a rig that is half built.
LOCK_FILE = RIG_ROOT / "qm-rig.lock"
ROLES = ("head", "worker")
# Stand-in RDMA character devices and HCAs per host (the dual inventory's allow-lists).
RDMA_DEVICES = ("rdma_cm", "uverbs0", "uverbs3")
HCAS = ("mlx5_0", "mlx5_3")


@dataclass
class RigHost:
    """One namespaced host as the tests see it."""

    role: str  # head | worker (the inventory host name may differ, see `name`)
    name: str  # inventory host name
    ns: str
    address: str
    rail2_address: str
    dir: str
    sshd_pid: int = 0

    @property
    def path(self) -> Path:
        """Root of this host's private directories."""
        return Path(self.dir)

    @property
    def bin_dir(self) -> Path:
        """Where the docker shim lives (first on PATH in SSH sessions)."""
        return self.path / "bin"

    @property
    def work_dir(self) -> Path:
        """The host's node run dir (what the inventory points the roles' node-side paths at)."""
        return self.path / "work"

    @property
    def devices_dir(self) -> Path:
        """Stand-in for /dev: holds infiniband/{rdma_cm,uverbs0,uverbs3}."""
        return self.path / "devices"

    @property
    def ib_dir(self) -> Path:
        """Stand-in for /sys/class/infiniband: one entry per HCA (ENGINESIM_IB_DIR)."""
        return self.path / "ib"

    @property
    def calls_file(self) -> Path:
        """docker_calls.jsonl: one JSON line per docker invocation on this host."""
        return self.path / "docker_calls.jsonl"

    @property
    def docker_home(self) -> Path:
        """The shim's container state (containers/<name>/state.json, removed/, pids.jsonl)."""
        return self.path / "docker"

    def docker_calls(self) -> list[dict]:
        """Every recorded docker call on this host, in order."""
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines() if line.strip()]

    def containers(self, include_removed: bool = True) -> list[dict]:
        """Shim states of this host's containers (live ones, and removed ones kept aside)."""
        files = list((self.docker_home / "containers").glob("*/state.json"))
        if include_removed:
            files += list((self.docker_home / "removed").glob("*/state.json"))
        return sorted((json.loads(f.read_text()) for f in files), key=lambda s: s["created"])

    def engine_pids(self) -> list[int]:
        """Every engine/supervisor PID the shim recorded on this host."""
        pids_file = self.docker_home / "pids.jsonl"
        if not pids_file.exists():
            return []
        pids: list[int] = []
        for line in pids_file.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                pids += [rec["pid"], rec["supervisor_pid"]]
        return pids

    def live_engine_pids(self) -> list[int]:
        """Recorded engine/supervisor PIDs that are still alive AND still an engine or its shim: PIDs wrap
        (at 32,768 here) during a long suite, so a bare recorded PID may name someone else's process."""
        live = []
        for pid, start in self.engine_pid_starts():
            same = start is None or start == procs.start_ticks(pid)
            if same and procs.alive(pid) and is_engine(procs.cmdline(pid)):
                live.append(pid)
        return live

    def engine_pid_starts(self) -> list[tuple[int, int | None]]:
        """(PID, start ticks) of every engine/supervisor the shim recorded (start None: not recorded)."""
        pids_file = self.docker_home / "pids.jsonl"
        if not pids_file.exists():
            return []
        out: list[tuple[int, int | None]] = []
        for line in pids_file.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out.append((rec["pid"], rec.get("pid_start")))
                out.append((rec["supervisor_pid"], rec.get("supervisor_start")))
        return out


@dataclass
class Rig:
    """A running (or torn-down) rig; all state needed for teardown is in `rig.json`."""

    rig_id: str
    dir: str
    subnet: str
    bridge: str
    rail2_bridge: str
    hosts: list[RigHost] = field(default_factory=list)
    owner_pid: int = 0
    root_links: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------------------------- paths

    @property
    def path(self) -> Path:
        """The rig directory (/tmp/qm-rig-<id>)."""
        return Path(self.dir)

    @property
    def key_file(self) -> Path:
        """The controller's throwaway private key."""
        return self.path / "controller" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """known_hosts with every rig host's key (the inventory's UserKnownHostsFile)."""
        return self.path / "controller" / "known_hosts"

    @property
    def control_path_dir(self) -> Path:
        """Per-rig ControlPath directory, so teardown can close exactly this rig's SSH masters."""
        return self.path / "cp"

    @property
    def inventory(self) -> Path:
        """The generated rig inventory directory (pass it to `-i`)."""
        return self.path / "inventory"

    def host(self, role: str) -> RigHost:
        """The host playing `role` (head or worker)."""
        return next(h for h in self.hosts if h.role == role)

    # ------------------------------------------------------------------------------ ansible env

    def ansible_env(self, paramiko: bool = False) -> dict[str, str]:
        """Environment for ansible/ansible-playbook against this rig (project ansible.cfg + rig SSH)."""
        env = dict(os.environ)
        env.update(
            LC_ALL="C.UTF-8",
            LANG="C.UTF-8",
            PATH=f"{VENV_PYTHON.parent}:{env.get('PATH', '/usr/bin:/bin')}",
            # Pipelining and ControlPersist come from the project's ansible.cfg (what users run); the rig
            # only confines the master sockets to its own dir so teardown can close exactly these.
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.control_path_dir),
            ANSIBLE_HOST_KEY_CHECKING="True",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_RETRY_FILES_ENABLED="False",
        )
        if (REPO / "ansible.cfg").exists():
            env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
        if paramiko:
            # paramiko reads ~/.ssh/known_hosts only: give it a HOME whose known_hosts is the rig's.
            env["HOME"] = str(self.path / "controller" / "home")
            env["ANSIBLE_PARAMIKO_RECORD_HOST_KEYS"] = "False"
            env["ANSIBLE_PARAMIKO_LOOK_FOR_KEYS"] = "False"
            env["ANSIBLE_LOCAL_TEMP"] = str(self.path / "controller" / "ansible-tmp")
        return env

    # -------------------------------------------------------------------------------------- up

    @classmethod
    def create(cls) -> Rig:
        """Allocate names for a new rig (the subnet is claimed, and everything built, in `up`)."""
        rig_id = secrets.token_hex(3)
        rig_dir = RIG_ROOT / f"{DIR_PREFIX}{rig_id}"
        rig = cls(
            rig_id=rig_id,
            dir=str(rig_dir),
            subnet="",
            bridge=f"{netns.PREFIX}b{rig_id}",
            rail2_bridge=f"{netns.PREFIX}c{rig_id}",
            owner_pid=os.getpid(),
        )
        from .inventory import role_names  # the host names inventory/dual uses for head and worker

        names = role_names()
        for role in ROLES:
            rig.hosts.append(
                RigHost(
                    role=role,
                    name=names[role],
                    ns=f"{netns.PREFIX}-{rig_id}-{role}",
                    address="",
                    rail2_address="",
                    dir=str(rig_dir / role),
                )
            )
        return rig

    def _claim_subnet(self) -> None:
        """Pick a /24 nothing uses now (call with the rig lock held) and give each host its addresses."""
        subnet = netns.pick_subnet(int(self.rig_id, 16))
        rail2 = ipaddress.ip_network(f"10.214.{subnet.network_address.packed[2]}.0/24")
        self.subnet = str(subnet)
        for index, host in enumerate(self.hosts):
            host.address = str(subnet.network_address + 2 + index)
            host.rail2_address = str(rail2.network_address + 2 + index)

    def save(self) -> None:
        """Write rig.json atomically (teardown and the CLI read it)."""
        data = asdict(self)
        tmp = self.path / ".rig.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path / "rig.json")

    @classmethod
    def load(cls, rig_dir: Path) -> Rig:
        """Read a rig back from its rig.json."""
        data = json.loads((rig_dir / "rig.json").read_text())
        hosts = [RigHost(**h) for h in data.pop("hosts")]
        return cls(hosts=hosts, **data)

    def up(self) -> Rig:
        """Build the rig; on any failure tear down what was built and re-raise."""
        with rig_lock():
            self._claim_subnet()
            self.path.mkdir(parents=True, exist_ok=False)
            self.save()
            try:
                self._build()
            except BaseException:
                self.down()
                raise
        return self

    def _build(self) -> None:
        net = ipaddress.ip_network(self.subnet)
        netns.create_bridge(self.bridge, f"{net.network_address + 1}/{net.prefixlen}")
        self.root_links.append(self.bridge)
        netns.create_bridge(self.rail2_bridge, None)
        self.root_links.append(self.rail2_bridge)
        self.save()
        controller = self.path / "controller"
        (controller / "home" / ".ssh").mkdir(parents=True)
        self.control_path_dir.mkdir(mode=0o700)
        client_pub = sshd.keygen(self.key_file, f"qm-rig-{self.rig_id}-controller")
        known: list[str] = []
        for index, host in enumerate(self.hosts):
            netns.create_namespace(host.ns)
            self.save()
            suffix = "hw"[index]
            netns.attach(host.ns, self.bridge, f"{netns.PREFIX}{self.rig_id}{suffix}0", "eth0",
                         f"{host.address}/{net.prefixlen}")  # fmt: skip
            self.root_links.append(f"{netns.PREFIX}{self.rig_id}{suffix}0")
            netns.attach(host.ns, self.rail2_bridge, f"{netns.PREFIX}{self.rig_id}{suffix}3", "eth3",
                         f"{host.rail2_address}/24")  # fmt: skip
            self.root_links.append(f"{netns.PREFIX}{self.rig_id}{suffix}3")
            self._make_host_dirs(host)
            config, host_pub = sshd.write_config(
                host.path, host.address, client_pub, str(host.bin_dir), host.name
            )
            known.append(sshd.known_hosts_line(host.address, host_pub))
            log = host.path / "ssh" / "sshd.log"
            proc = sshd.start(host.ns, config, log)
            host.sshd_pid = proc.pid
            self.save()
            sshd.wait_listening(host.address, proc, log)
        self.known_hosts.write_text("\n".join(known) + "\n")
        (controller / "home" / ".ssh" / "known_hosts").write_text("\n".join(known) + "\n")
        from .inventory import write_inventory  # local import: inventory reads the repo's dual inventory

        write_inventory(self)
        self.save()

    def _make_host_dirs(self, host: RigHost) -> None:
        """Per-host dirs, stand-in RDMA devices and HCAs, and the docker shim on the host's PATH."""
        for sub in ("work", "bin", "ib", "docker", "tmp", "home", "devices/infiniband"):
            (host.path / sub).mkdir(parents=True, exist_ok=True)
        for dev in RDMA_DEVICES:
            make_char_device(host.devices_dir / "infiniband" / dev)
        for hca in HCAS:
            make_hca(host.ib_dir, hca)
        shim = host.bin_dir / "docker_shim.py"
        shutil.copyfile(Path(__file__).with_name("docker_shim.py"), shim)
        wrapper = host.bin_dir / "docker"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# quickmap rig: docker CLI stand-in (records argv, runs enginesim); see tests/rig\n"
            f"export QM_SHIM_HOME='{host.docker_home}' QM_SHIM_CALLS='{host.calls_file}'\n"
            f"export QM_SHIM_PYTHON='{VENV_PYTHON}' QM_RIG_HOST='{host.name}'\n"
            f"exec '{VENV_PYTHON}' '{shim}' \"$@\"\n"
        )
        wrapper.chmod(0o755)
        smi = host.bin_dir / "nvidia_smi_shim.py"
        shutil.copyfile(Path(__file__).with_name("nvidia_smi_shim.py"), smi)
        smi_wrapper = host.bin_dir / "nvidia-smi"
        smi_wrapper.write_text(
            "#!/bin/sh\n"
            "# quickmap rig: nvidia-smi stand-in (GPUs busy while a shim container runs); see tests/rig\n"
            f"export QM_SHIM_HOME='{host.docker_home}'\n"
            f"exec /usr/bin/python3 '{smi}' \"$@\"\n"
        )
        smi_wrapper.chmod(0o755)

    # ------------------------------------------------------------------------------------ down

    def down(self) -> list[str]:
        """Tear everything down; never raises, returns notes about anything that resisted."""
        notes: list[str] = []
        close_masters(self.control_path_dir)
        # Engines the shim started (recorded PIDs), checked to still be engines before they are signalled.
        engine_pids = []
        for host in self.hosts:
            for pid in host.engine_pids():
                if is_engine(procs.cmdline(pid)):
                    engine_pids.append(pid)
        procs.terminate(engine_pids, grace_s=2.0)
        for host in self.hosts:
            if host.sshd_pid and procs.alive(host.sshd_pid):
                argv = procs.cmdline(host.sshd_pid)
                if argv and "sshd" in argv[0]:
                    children = procs.descendants(host.sshd_pid)
                    procs.terminate([host.sshd_pid], grace_s=2.0)
                    procs.terminate(children, grace_s=2.0)
        for host in self.hosts:
            if host.ns in netns.list_namespaces():
                leftovers = netns.namespace_pids(host.ns)
                if leftovers:
                    notes.append(f"{host.ns}: ended leftover pids {leftovers}")
                    procs.terminate(leftovers, grace_s=2.0)
                netns.delete_namespace(host.ns)
        for link in [*self.root_links, self.bridge, self.rail2_bridge]:
            netns.delete_link(link)
        for host in self.hosts:
            if host.ns in netns.list_namespaces():
                notes.append(f"namespace {host.ns} could not be deleted")
        if os.environ.get("QM_RIG_KEEP") != "1":
            shutil.rmtree(self.path, ignore_errors=True)
        return notes


def make_char_device(path: Path) -> None:
    """A character device node (same numbers as /dev/null) so `-c` checks pass; a file when mknod fails."""
    with contextlib.suppress(FileExistsError):
        try:
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
        except PermissionError:
            path.touch()


def make_hca(ib_dir: Path, hca: str) -> None:
    """An HCA entry shaped like /sys/class/infiniband/<hca> (ports/1/state, link_layer)."""
    port = ib_dir / hca / "ports" / "1"
    port.mkdir(parents=True, exist_ok=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")


def close_masters(control_path_dir: Path) -> None:
    """`ssh -O exit` on every ControlPersist master socket in the rig's ControlPath dir."""
    if not control_path_dir.exists():
        return
    for sock in control_path_dir.iterdir():
        if sock.is_socket():
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "qm-rig"],
                capture_output=True,
                timeout=10,
                check=False,
            )
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(s.is_socket() for s in control_path_dir.iterdir()):
        time.sleep(0.05)


def teardown_dir(rig_dir: Path) -> list[str]:
    """Tear down the rig recorded in `rig_dir` (used for stale rigs and by `python -m tests.rig down`)."""
    try:
        rig = Rig.load(rig_dir)
    except (OSError, ValueError, TypeError) as err:
        shutil.rmtree(rig_dir, ignore_errors=True)
        return [f"{rig_dir}: unreadable rig.json ({err}); directory removed"]
    return rig.down()


def owner_alive(rig_dir: Path) -> bool:
    """True when the process that built the rig in `rig_dir` still runs (a parallel run: leave it)."""
    try:
        pid = json.loads((rig_dir / "rig.json").read_text())["owner_pid"]
    except (OSError, ValueError, KeyError):
        return False
    return procs.alive(pid) and "python" in " ".join(procs.cmdline(pid))


@contextlib.contextmanager
def rig_lock() -> Iterator[None]:
    """An exclusive lock shared by every rig builder and cleaner on this machine (flock, freed on exit)."""
    RIG_ROOT.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cleanup_stale(force: bool = False) -> list[str]:
    """Remove rigs left by crashed runs: dirs whose owner is gone, and orphan `qmr-*` namespaces/links."""
    with rig_lock():
        return _cleanup_stale(force)


def _cleanup_stale(force: bool) -> list[str]:
    notes: list[str] = []
    live_ids: set[str] = set()
    for rig_dir in sorted(RIG_ROOT.glob(f"{DIR_PREFIX}*")):
        rig_id = rig_dir.name[len(DIR_PREFIX) :]
        if not force and owner_alive(rig_dir):
            live_ids.add(rig_id)
            continue
        notes += teardown_dir(rig_dir)
        notes.append(f"removed stale rig {rig_id}")
    for ns in netns.list_namespaces():
        if ns.startswith(f"{netns.PREFIX}-") and ns.split("-")[1] not in live_ids:
            for pid in netns.namespace_pids(ns):
                procs.terminate([pid], grace_s=1.0)
            netns.delete_namespace(ns)
            notes.append(f"removed orphan namespace {ns}")
    for link in netns.list_links():
        if link.startswith(netns.PREFIX) and not any(rid in link for rid in live_ids):
            netns.delete_link(link)
            notes.append(f"removed orphan link {link}")
    return notes


def unavailable_reason() -> str | None:
    """Why a rig cannot be built here (no root/namespaces, no sshd), or None."""
    if os.geteuid() != 0:
        return "the rig needs root to create network namespaces (not root here)"
    reason = netns.probe()
    if reason:
        return reason
    try:
        sshd.sshd_binary()
    except sshd.SshdError as err:
        return str(err)
    if not VENV_PYTHON.exists():
        return f"project venv python missing at {VENV_PYTHON} (run make venv)"
    if shutil.which("ssh") is None:
        return "OpenSSH client `ssh` not found (run tests/rig/install_system_deps.sh)"
    return None


def main_python() -> str:
    """The interpreter the tests run ansible with (the project's venv)."""
    return str(VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable))


def is_engine(argv: list[str]) -> bool:
    """Whether a process's argv is enginesim or the docker shim that supervises it."""
    joined = " ".join(argv)
    return "enginesim" in joined or "docker_shim" in joined
