# Copyright: quickmap contributors
# Apache-2.0
"""Keep results/<run_id>/run.log: the orchestration record next to the evidence it produced.

One line per task result and host (UTC time, status, host, seconds, task name, and the message of a
failure), so a reviewer can see from the run directory alone what ran, where, how long it took and
why it stopped. The path comes from the ``quickmap_run_log`` fact the preflight play pins only after it
checked the run id; lines seen before that (or before the directory exists) are buffered, and a path
that is not a plain absolute ``.../<run_id>/run.log`` is never opened. A resumed run appends. Nothing is
written in a dry run (the fact is empty there). Every line goes through quickmap's one secret rule
(``module_utils/redact.py``), the same that masks the manifest, the report and the saved commands.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ansible.plugins.callback import CallbackBase

try:
    from module_utils.redact import redact_text
except ImportError:  # a checkout run from elsewhere: the repository root holds module_utils/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from module_utils.redact import redact_text

DOCUMENTATION = """
name: quickmap_runlog
type: notification
short_description: write results/<run_id>/run.log, one line per task result
description:
  - Appends every task result (time, status, host, duration, task, failure message) to the file named
    by the C(quickmap_run_log) fact; buffers lines until that fact is known and its directory exists.
requirements:
  - enable in ansible.cfg (callbacks_enabled)
"""


_RECAP_KEYS = ("ok", "changed", "failures", "unreachable", "skipped", "rescued")


def _safe_log_path(path: str) -> str | None:
    """``path`` when it is an absolute, normalised ``.../<dir>/run.log``; None otherwise."""
    if not path or not os.path.isabs(path) or os.path.normpath(path) != path:
        return None
    if os.path.basename(path) != "run.log" or ".." in Path(path).parts:
        return None
    return path


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class CallbackModule(CallbackBase):
    """Notification callback; see the module docstring."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "quickmap_runlog"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path: str | None = None
        self._pending: list[str] = []
        self._task_started: dict[str, float] = {}

    def v2_playbook_on_start(self, playbook) -> None:
        argv = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])
        self._emit(f"{_utc(time.time())} START    {argv}")

    def v2_playbook_on_play_start(self, play) -> None:
        self._emit(f"{_utc(time.time())} PLAY     {play.get_name()}")

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._task_started[task._uuid] = time.time()

    def v2_runner_on_ok(self, result) -> None:
        facts = (result._result or {}).get("ansible_facts") or {}
        if "quickmap_run_log" in facts:
            self._path = _safe_log_path(str(facts["quickmap_run_log"] or ""))
        self._result_line("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        self._result_line("ignored" if ignore_errors else "FAILED", result)

    def v2_runner_on_unreachable(self, result) -> None:
        self._result_line("UNREACH", result)

    def v2_playbook_on_stats(self, stats) -> None:
        for host in sorted(stats.processed):
            s = stats.summarize(host)
            counts = " ".join(f"{k}={s[k]}" for k in _RECAP_KEYS)
            self._emit(f"{_utc(time.time())} RECAP    {host} {counts}")

    def _result_line(self, status: str, result) -> None:
        task = result._task
        started = self._task_started.get(task._uuid, time.time())
        now = time.time()
        line = f"{_utc(now)} {status:<8} {result._host.get_name()} {now - started:7.2f}s {task.get_name()}"
        if status in ("FAILED", "UNREACH"):
            msg = str((result._result or {}).get("msg", "")).replace("\n", " ")[:500]
            line += f" :: {msg}"
        self._emit(line)

    def _emit(self, line: str) -> None:
        self._pending.append(redact_text(line))
        if not self._path or not os.path.isdir(os.path.dirname(self._path)):
            return
        try:
            with open(self._path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(self._pending) + "\n")
            self._pending.clear()
        except OSError as exc:
            self._display.warning(f"quickmap_runlog: cannot append to {self._path}: {exc}")
            self._path = None
