# Copyright: quickmap contributors
# Apache-2.0
"""Is this PID still the process we started? (Linux /proc, stdlib only.)

A PID alone names a process only until it exits: after a crash or a reboot the number is handed to
someone else, and signalling it would kill an unrelated process group. A started server is therefore
recorded with three things that together pin it down (PID, start time in clock ticks since boot from
``/proc/<pid>/stat`` field 22, command line from ``/proc/<pid>/cmdline``) plus the boot id, because
start ticks restart at zero on every boot. :func:`same_process` compares a record with what ``/proc``
says now and, when they differ, says which of them changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# A function applied to a live command line before it is recorded or compared (quickmap masks the
# values of secret flags, so a record never holds them and a masked record still matches).
Mask = Callable[[list], list]

_PROC = "/proc"


def boot_id(proc: str = _PROC) -> str | None:
    """This boot's random id (``/proc/sys/kernel/random/boot_id``); None when unreadable."""
    try:
        with open(os.path.join(proc, "sys", "kernel", "random", "boot_id")) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def stat_fields(pid: int, proc: str = _PROC) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name, starting at field 3 (state)."""
    try:
        with open(os.path.join(proc, str(pid), "stat")) as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text.rsplit(")", 1)[-1].split()


def start_ticks(pid: int, proc: str = _PROC) -> int | None:
    """Start time of ``pid`` in clock ticks after boot (stat field 22); None when it is gone."""
    fields = stat_fields(pid, proc)
    if not fields or len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def cmdline(pid: int, proc: str = _PROC) -> list[str] | None:
    """argv of ``pid`` as the kernel shows it; None when it is gone (or a kernel thread)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    if not raw:
        return None
    return raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")


def alive(pid: int, proc: str = _PROC) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    fields = stat_fields(pid, proc)
    return bool(fields) and fields[0] != "Z"


def identity(pid: int, mask: Mask | None = None, proc: str = _PROC) -> dict | None:
    """The record of a running ``pid`` (pid, start_ticks, boot_id, cmdline); None when it is gone."""
    if not alive(pid, proc):
        return None
    ticks = start_ticks(pid, proc)
    argv = cmdline(pid, proc)
    if ticks is None or argv is None:
        return None
    return {
        "pid": pid,
        "start_ticks": ticks,
        "boot_id": boot_id(proc),
        "cmdline": mask(argv) if mask else argv,
    }


def _short(argv: list) -> str:
    text = " ".join(str(a) for a in argv)
    return text if len(text) <= 160 else text[:157] + "..."


def same_process(record: dict, mask: Mask | None = None, proc: str = _PROC) -> tuple[bool, str]:
    """(True, "") when the recorded process still runs; else (False, which part no longer matches).

    ``mask`` must be the function the record's command line was masked with when it was written.
    """
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False, f"the record holds no usable pid ({pid!r})"
    now = identity(pid, mask, proc)
    if now is None:
        return False, f"pid {pid} is not running"
    if record.get("boot_id") and now["boot_id"] and record["boot_id"] != now["boot_id"]:
        return False, f"the machine rebooted since the record was written, so pid {pid} is another process"
    if now["start_ticks"] != record.get("start_ticks"):
        return False, (
            f"pid {pid} started at tick {now['start_ticks']}, not at tick {record.get('start_ticks')} "
            "as recorded (the PID was reused)"
        )
    if now["cmdline"] != record.get("cmdline"):
        return False, (
            f"pid {pid} runs `{_short(now['cmdline'])}`, "
            f"not the recorded `{_short(record.get('cmdline') or [])}`"
        )
    return True, ""
