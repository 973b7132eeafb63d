"""Run the real `ansible` and `ansible-playbook` CLIs against the rig (what a user would type)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .core import REPO, VENV_PYTHON, Rig


@dataclass
class AnsibleRunner:
    """Builds and runs ansible commands with `-i <rig inventory>` and the rig's environment."""

    rig: Rig

    def adhoc(
        self,
        pattern: str,
        module: str,
        args: str = "",
        *extra: str,
        paramiko: bool = False,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`ansible PATTERN -i RIG -m MODULE [-a ARGS] [-c paramiko_ssh] EXTRA...`."""
        cmd = [str(VENV_PYTHON.parent / "ansible"), pattern, "-i", str(self.rig.inventory), "-m", module]
        if args:
            cmd += ["-a", args]
        if paramiko:
            cmd += ["-c", "paramiko_ssh"]
        return self._run([*cmd, *extra], paramiko, timeout, env)

    def playbook(
        self,
        playbook: str,
        *extra: str,
        inventory: Path | None = None,
        timeout: float = 300,
        paramiko: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """`ansible-playbook PLAYBOOK -i RIG EXTRA...` from the repository root."""
        cmd = [
            str(VENV_PYTHON.parent / "ansible-playbook"),
            playbook,
            "-i",
            str(inventory or self.rig.inventory),
            *extra,
        ]
        return self._run(cmd, paramiko, timeout)

    def _run(
        self, cmd: list[str], paramiko: bool, timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            cwd=REPO,
            env={**self.rig.ansible_env(paramiko=paramiko), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
