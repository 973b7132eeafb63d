"""`--sim-scheduler-process`: the emulated engine runs in a child process that carries the title of the
real engine's scheduler process, so that a process-tree walk and py-spy meet a real child.

Why: the real engines split the server into processes. SGLang's scheduler runs in a subprocess that
calls itself `sglang::scheduler_TP0` (`setproctitle` in `run_scheduler_process`, SGLang's
`managers/scheduler.py`); vLLM V1's scheduler runs in the `EngineCore` process, titled
`VLLM::EngineCore` (`set_process_title("EngineCore")` in `v1/engine/core.py`, the prefix `VLLM` from
`VLLM_PROCESS_NAME_PREFIX`). A lab that profiles the scheduler must find that child from the server's
recorded PID. Here the parent validates the flags, starts the child and forwards SIGTERM/SIGINT to it;
the child runs the whole emulated server (scheduler, step loop and, unlike the real engines, the HTTP
front too). The child dies with its parent (PR_SET_PDEATHSIG, what SGLang's
`kill_itself_when_parent_died` sets).

The title: argv[0] of the child is the title (`/proc/<pid>/cmdline` starts with it) and its `comm` is
the title cut to 15 bytes, as `setproctitle` leaves it; the real engines' cmdline holds the title only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys

CHILD_ENV = "ENGINESIM_SCHEDULER_CHILD_ARGV"  # the server's argv (JSON) handed to the child
_EXE_ENV = "ENGINESIM_SCHEDULER_PARENT_EXECUTABLE"
_TITLE_ENV = "ENGINESIM_SCHEDULER_TITLE"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def title(flavour: str) -> str:
    """The process title the real engine gives its scheduler process (single node, no DP)."""
    return "VLLM::EngineCore" if flavour == "vllm" else "sglang::scheduler_TP0"


def in_child() -> bool:
    return CHILD_ENV in os.environ


def run_parent(argv: list[str], flavour: str) -> int:
    """Start the child with the same argv, forward TERM/INT to it, return its exit status."""
    env = dict(os.environ)
    env[CHILD_ENV] = json.dumps(argv)
    env[_EXE_ENV] = sys.executable
    env[_TITLE_ENV] = title(flavour)
    # argv[0] is the title, so Python cannot find its venv from it: hand the import path over.
    # (an editable install's import hook lives in a .pth file, which PYTHONPATH does not run: name the
    # directory that holds this package first).
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([here, *(p for p in sys.path if p)])
    child = subprocess.Popen(
        [title(flavour), "-m", "enginesim.schedproc"], executable=sys.executable, env=env
    )

    def forward(sig: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    while True:
        try:
            return child.wait()
        except InterruptedError:
            continue


def _prctl(option: int, arg: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the title stays in argv[0] only
        ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(arg), 0, 0, 0)


def _child_main() -> int:
    argv = json.loads(os.environ[CHILD_ENV])
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        return 1  # the parent died before the death signal was armed
    name = ctypes.create_string_buffer(os.environ.get(_TITLE_ENV, "").encode()[:15])
    _prctl(_PR_SET_NAME, ctypes.addressof(name))
    sys.executable = os.environ.get(_EXE_ENV, sys.executable)  # for the pacing replay subprocess
    from .server import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(_child_main())
