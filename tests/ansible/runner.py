"""Drive quick_map.yml for tests and benchmarks: ansible-runner (job events) or the plain CLI.

Both paths run the real playbook against the real inventory with the real modules; only the
results directory, the ports and (for speed) a few tunables are overridden with extra vars.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PLAYBOOK = REPO / "quick_map.yml"
LOCAL_INVENTORY = REPO / "inventory" / "local"


def free_port() -> int:
    """A TCP port nothing listens on right now (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ansible_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment ansible-core needs: UTF-8 locale, the repo's ansible.cfg, the venv first on PATH."""
    env = dict(os.environ)
    env.update(
        {
            "LC_ALL": "C.UTF-8",
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.update(extra or {})
    return env


def zipapp_path(tmp_dir: Path) -> Path:
    """The client zipapp: build/loadgen.pyz from `make zipapp`, else built into tmp_dir."""
    built = REPO / "build" / "loadgen.pyz"
    if built.is_file():
        return built
    out = tmp_dir / "loadgen.pyz"
    subprocess.run(
        [sys.executable, "-m", "loadgen.build_zipapp", str(out)], cwd=REPO, check=True, capture_output=True
    )
    return out


@dataclass
class CliRun:
    """Result of one ansible-playbook invocation."""

    rc: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def base_extravars(results_dir: Path, pyz: Path, port: int, **extra: Any) -> dict[str, Any]:
    """Extra vars that isolate one run: its own results root, client zipapp and server port."""
    ev: dict[str, Any] = {
        "quickmap_results_dir": str(results_dir),
        "quickmap_loadgen_pyz": str(pyz),
        "engine_port": port,
    }
    ev.update(extra)
    return ev


def run_cli(
    extravars: dict[str, Any],
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    inventory: Path | None = None,
) -> CliRun:
    """`ansible-playbook quick_map.yml [-i INV] -e @vars.json ARGS...` exactly as a user types it."""
    cmd = [str(VENV_BIN / "ansible-playbook"), str(PLAYBOOK)]
    if inventory is not None:
        cmd += ["-i", str(inventory)]
    cmd += ["-e", json.dumps(extravars), *args]
    p = subprocess.run(cmd, cwd=REPO, env=ansible_env(env), capture_output=True, text=True, timeout=timeout)
    return CliRun(p.returncode, p.stdout, p.stderr)


_RUNNER_ENV = ("LC_ALL", "LANG", "ANSIBLE_CONFIG", "PATH")


def run_runner(
    private_dir: Path,
    extravars: dict[str, Any],
    *,
    tags: str | None = None,
    cmdline: str | None = None,
    timeout: int = 600,
) -> Any:
    """ansible_runner.run on quick_map.yml; returns the Runner (status, rc, events)."""
    import ansible_runner

    private_dir.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_dir),
        "project_dir": str(REPO),
        "playbook": str(PLAYBOOK),
        "inventory": str(LOCAL_INVENTORY),
        "extravars": extravars,
        "envvars": {
            k: v for k, v in ansible_env().items() if k in ("LC_ALL", "LANG", "ANSIBLE_CONFIG", "PATH")
        },
        "quiet": True,
        "suppress_env_files": True,
        "timeout": timeout,
        "settings": {"idle_timeout": timeout, "job_timeout": timeout},
    }
    if tags:
        kwargs["tags"] = tags
    if cmdline:
        kwargs["cmdline"] = cmdline
    return ansible_runner.run(**kwargs)


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (and is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def recorded_servers(results: Path) -> list[dict[str, Any]]:
    """Every server start record (server_process module) under a results root."""
    out = []
    for path in sorted(results.glob("*/server/*.server.json")) if results.is_dir() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def server_still_running(record: dict[str, Any]) -> bool:
    """True while the recorded process is still the one that was started (PID + start time + cmdline)."""
    sys.path.insert(0, str(REPO))
    from module_utils.proc_identity import same_process
    from module_utils.redact import mask_argv

    return same_process(record, mask_argv)[0]


def kill_recorded_servers(results: Path) -> None:
    """Test clean-up: SIGKILL the process group of every recorded server that is still the one started."""
    import signal

    for rec in recorded_servers(results):
        if rec.get("runtime") == "process" and server_still_running(rec):
            os.killpg(int(rec["pid"]), signal.SIGKILL)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def ensure_tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not on PATH")
    return found
