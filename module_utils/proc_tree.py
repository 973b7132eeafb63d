# Copyright: quickmap contributors
# Apache-2.0
"""The process tree under one recorded PID, read from /proc (Linux, stdlib only).

Why: a lab that profiles an engine's scheduler must attach to the scheduler of *its* server. The
engines run it as a child process (SGLang's `sglang::scheduler_TP0`, vLLM's `VLLM::EngineCore`); a
machine-wide search by name takes whichever process of that name comes first (another run's server,
a leftover). Here the walk starts at the PID the engine role recorded and follows only its children
(`/proc/<pid>/task/<tid>/children`; where the kernel lacks that file, the parent field of every
`/proc/<n>/stat`), so only descendants of our server can be chosen.
"""

from __future__ import annotations

import os
import re
import time

from ansible.module_utils.proc_identity import alive, cmdline, stat_fields

# A child caught inside execve shows an empty argv for a moment: the kernel closes its close-on-exec
# descriptors (so its parent's Popen has returned and may have told us its PID) before it sets the new
# argv. Seconds to wait for it while it lives; under load the window stretches.
EXEC_WAIT_S = 2.0

_PROC = "/proc"


def children(pid: int, proc: str = _PROC) -> list[int]:
    """Direct children of ``pid`` (every thread's list), sorted; [] when it is gone."""
    task_dir = os.path.join(proc, str(pid), "task")
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return []
    found: set[int] = set()
    have_file = False
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "children")) as handle:
                found.update(int(x) for x in handle.read().split())
            have_file = True
        except (OSError, ValueError):
            continue
    if have_file:
        return sorted(found)
    return sorted(n for n in _all_pids(proc) if _ppid(n, proc) == pid)


def _all_pids(proc: str) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def _ppid(pid: int, proc: str) -> int | None:
    fields = stat_fields(pid, proc)
    return int(fields[1]) if fields and len(fields) > 1 and fields[1].isdigit() else None


def descendants(root: int, proc: str = _PROC, limit: int = 512) -> list[dict]:
    """Every process under ``root`` (breadth first): pid, ppid, depth and command line."""
    out: list[dict] = []
    queue = [(root, 0)]
    seen = {root}
    while queue and len(out) < limit:
        pid, depth = queue.pop(0)
        for child in children(pid, proc):
            if child in seen:
                continue
            seen.add(child)
            argv = _argv(child, proc)
            if argv is None:
                continue  # exited meanwhile
            out.append({"pid": child, "ppid": pid, "depth": depth + 1, "cmdline": argv})
            queue.append((child, depth + 1))
    return out


def _argv(pid: int, proc: str, wait_s: float = EXEC_WAIT_S) -> list[str] | None:
    """The argv of a live child, waiting out an execve in progress; None when it is gone or a zombie."""
    deadline = time.monotonic() + wait_s
    while True:
        argv = cmdline(pid, proc)
        if argv is not None or not alive(pid, proc) or time.monotonic() >= deadline:
            return argv
        time.sleep(0.005)


def matching(tree: list[dict], pattern: str) -> list[dict]:
    """The processes whose title (argv[0]) fully matches ``pattern``, in tree order."""
    rx = re.compile(pattern)
    return [p for p in tree if p["cmdline"] and rx.fullmatch(p["cmdline"][0])]
