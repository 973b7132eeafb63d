"""Ctrl-C safety net: when a quick-map run is interrupted after its servers started, stop them.

ansible-core turns SIGINT into KeyboardInterrupt and exits (code 99) without running any later play,
so block/rescue/always cannot catch a Ctrl-C. This callback remembers the run id and whether a server
start was attempted; if the playbook ends without its final stats, an atexit hook runs

    ansible-playbook <same playbook> [-i <same inventories>] [-e <same extra vars>] \
        --tags stop -e run_id=<id> -e quickmap_interrupted=true

which saves the evidence (docker inspect + logs, the process log), stops every server by its recorded
PID/container, and marks the manifest `interrupted`. It never runs under --check, for runs that never
started a server, or inside the stop run it launches itself.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys

from ansible import context
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: quickmap_interrupt
type: notification
short_description: Stop the quick map's servers (with evidence) when a run is interrupted
description:
  - On an interrupted ansible-playbook run (Ctrl-C) that had started servers, runs the stop phase.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""

_GUARD = "QUICKMAP_INTERRUPT_STOP"


class CallbackModule(CallbackBase):
    """Notification callback; see the module docstring."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "quickmap_interrupt"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._playbook: str | None = None
        self._run_id: str | None = None
        self._server_started = False
        self._finished = False
        if not os.environ.get(_GUARD):
            atexit.register(self._on_exit)

    def v2_playbook_on_start(self, playbook) -> None:
        self._playbook = playbook._file_name

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        if "Engine | run the server command" in task.get_name():
            self._server_started = True

    def v2_runner_on_ok(self, result) -> None:
        facts = (result._result or {}).get("ansible_facts") or {}
        if facts.get("quickmap_run_id"):
            self._run_id = str(facts["quickmap_run_id"])

    def v2_playbook_on_stats(self, stats) -> None:
        self._finished = True

    def _on_exit(self) -> None:
        args = context.CLIARGS
        if self._finished or not self._server_started or not self._run_id or not self._playbook:
            return
        if args.get("check"):
            return
        cmd = [sys.argv[0], self._playbook]
        for inv in args.get("inventory") or ():
            cmd += ["-i", inv]
        for ev in args.get("extra_vars") or ():
            cmd += ["-e", ev]
        cmd += ["--tags", "stop", "-e", json.dumps({"run_id": self._run_id, "quickmap_interrupted": True})]
        sys.stderr.write(
            f"\nquickmap: run {self._run_id} interrupted; stopping its servers with evidence "
            "(Ctrl-C again to skip)\n"
        )
        sys.stderr.flush()
        # The child gets its own pipes (ansible-playbook exits 5 on stdio it finds non-blocking, which
        # this interrupted process's may be); its output is relayed line by line.
        try:
            with subprocess.Popen(
                cmd,
                env=dict(os.environ, **{_GUARD: "1"}),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ) as child:
                for line in child.stdout or ():  # stdout=PIPE: always a stream
                    sys.stderr.write(line)
            sys.stderr.write(f"quickmap: stop phase of run {self._run_id} exited {child.returncode}\n")
        except KeyboardInterrupt:
            sys.stderr.write(f"quickmap: skipped; stop later with --tags stop -e run_id={self._run_id}\n")
