# Copyright: quickmap contributors
# Apache-2.0
"""A console a person can follow: one line per phase and per case, progress while a case runs.

The default callback prints a block per task (about 76 for `make run`), most of them bookkeeping. This
one prints what a person running the map asks: which phase finished, how long it took and whether it
failed; for each benchmark case its status, duration, output tok/s, TTFT p50 and the emulator's
honesty verdict (meta.json `emulation.verdict`, "n/a" where none was recorded); while a case runs, a
progress line from loadgen's `--progress-file`; every failure with its reason and where its evidence
is; the messages the roles print on purpose (debug tasks: check-mode commands, gate verdicts); and, as
the last line, the report path. `ANSIBLE_STDOUT_CALLBACK=default` brings the task-by-task view back.

Case lines come from the `bench_case` action's results (`case_dir`, `case`, `case_failed`) and the
files it leaves in the controller's case directory (meta.json, bench.json). The progress line reads
`progress.json` in the controller's case directories, so it shows where the head writes there (the
embedded inventory); on a remote head the case line still comes when the case ends.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: quickmap_console
type: stdout
short_description: one line per phase and per benchmark case, a progress line, the report path last
description:
  - Prints one line per phase (play-name prefix before C( | )) with its status and duration, one line
    per benchmark case (status, duration, output tok/s, TTFT p50, honesty verdict), a progress line
    while a case runs (from loadgen's C(--progress-file)), every failure with its reason and evidence
    path, the messages of debug tasks, and the report path as the last line.
requirements:
  - set as stdout_callback in ansible.cfg (ANSIBLE_STDOUT_CALLBACK=default restores the default view)
options:
  progress_interval:
    description: Seconds between two progress lines of a running case.
    type: float
    default: 3.0
    env:
      - name: QUICKMAP_CONSOLE_PROGRESS_INTERVAL
    ini:
      - section: callback_quickmap_console
        key: progress_interval
"""

# Tasks that only set up other tasks: a phase where nothing else ran says `skipped` (a play left out
# by --tags still runs its `always` bookkeeping: role argument validation, includes).
_SETUP_ACTIONS = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in (
        "include_role",
        "include_tasks",
        "import_role",
        "import_tasks",
        "include_vars",
        "set_fact",
        "validate_argument_spec",
        "meta",
    )
)
# Phases whose cases write progress.json (the progress thread sleeps through the others).
_CASE_PHASES = ("Fixed", "Mixed")
# A progress file older than this belongs to a case that ended (or died): no line for it.
_STALE_S = 20.0


def phase_of(play_name: str) -> str:
    """`Serve | start the head` -> `Serve`: the phase is the play name's prefix."""
    return play_name.split(" | ", 1)[0].strip() or play_name


def fmt_seconds(seconds: float) -> str:
    """3.2s, 74s, 12m05s: short enough for a status line."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def fmt_number(value: Any, unit: str, digits: int = 1) -> str:
    """A figure with its unit, or n/a when the result file does not hold it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "n/a"
    return f"{value:.{digits}f} {unit}"


def verdict_of(meta: dict[str, Any]) -> str:
    """The honesty verdict recorded for the case (emulator realtime verdict), or n/a."""
    emulation = meta.get("emulation") if isinstance(meta.get("emulation"), dict) else {}
    verdict = emulation.get("verdict", meta.get("verdict"))
    if not verdict:
        return "n/a"
    factor = emulation.get("realtime_factor", meta.get("realtime_factor"))
    if isinstance(factor, int | float) and not isinstance(factor, bool):
        return f"{verdict} (realtime x{factor:.2f})"
    return str(verdict)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from disk, or {} when it is missing, half-written or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def case_line(label: str, case_dir: Path, seconds: float, failed: dict[str, Any] | None) -> str:
    """One line for a finished case, from its meta.json and bench.json (failures: reason + evidence)."""
    meta = read_json(case_dir / "meta.json")
    if failed:
        return (
            f"case {label}  FAILED ({failed.get('error_type', 'failed')})  {fmt_seconds(seconds)}  "
            f"reason: {failed.get('reason', '')}; {failed.get('evidence', '')}; evidence: {case_dir}"
        )
    bench = read_json(case_dir / "bench.json")
    status = meta.get("status", "completed")
    return (
        f"case {label}  {status}  {fmt_seconds(seconds)}  "
        f"out {fmt_number(bench.get('output_throughput'), 'tok/s')}  "
        f"TTFT p50 {fmt_number(bench.get('median_ttft_ms'), 'ms')}  verdict {verdict_of(meta)}"
    )


def progress_line(label: str, progress: dict[str, Any]) -> str:
    """`... cases/x/rep1  120/512 requests  980.3 tok/s so far  8.1s` from loadgen's progress.json."""
    return (
        f"  ... {label}  {progress.get('completed', '?')}/{progress.get('total', '?')} requests  "
        f"{fmt_number(progress.get('output_tok_s'), 'tok/s')} so far  "
        f"{fmt_seconds(float(progress.get('elapsed_s') or 0.0))}"
    )


def running_progress(run_dir: Path, now: float) -> list[tuple[str, dict[str, Any]]]:
    """(case label, progress) of every case whose main phase is running now, from progress.json files."""
    found = []
    paths = [*run_dir.glob("cases/*/rep*/progress.json"), *run_dir.glob("mixed/rep*/*/progress.json")]
    for path in sorted(paths):
        try:
            fresh = now - path.stat().st_mtime < _STALE_S
        except OSError:
            continue
        progress = read_json(path) if fresh else {}
        if progress.get("phase") == "main":
            found.append((path.parent.relative_to(run_dir).as_posix(), progress))
    return found


def first_line(text: Any, limit: int = 600) -> str:
    """A message on one line (Ansible messages can be lists or carry newlines)."""
    if isinstance(text, list):
        text = "; ".join(str(t) for t in text)
    return " ".join(str(text).split())[:limit]


class CallbackModule(CallbackBase):
    """Stdout callback; see the module docstring."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "quickmap_console"

    def __init__(self) -> None:
        super().__init__()
        self._phase: dict[str, Any] | None = None
        self._run_dir: Path | None = None
        self._last_lines: list[str] = []
        self._task_started: dict[str, float] = {}
        self._items_failed: set[str] = set()
        self._tty = sys.stdout.isatty()
        self._progress_shown = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._interval = 3.0

    def set_options(self, task_keys=None, var_options=None, direct=None) -> None:
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._interval = max(0.5, float(self.get_option("progress_interval")))

    # ------------------------------------------------------------------------------ output

    def _say(self, line: str, color: str | None = None) -> None:
        if self._progress_shown:  # a progress line drawn in place on a terminal: clear it first
            self._display.display("\r\033[K", newline=False)
            self._progress_shown = False
        self._display.display(line, color=color)

    # ------------------------------------------------------------------------------ phases

    def v2_playbook_on_play_start(self, play) -> None:
        phase = phase_of(play.get_name())
        if self._phase is None or self._phase["name"] != phase:
            self._close_phase()
            self._phase = {"name": phase, "started": time.monotonic(), "ran": 0, "failed": False, "cases": 0}
        if phase in _CASE_PHASES and self._thread is None:
            self._thread = threading.Thread(target=self._watch_progress, name="qm-progress", daemon=True)
            self._thread.start()

    def _close_phase(self) -> None:
        phase = self._phase
        if phase is None:
            return
        self._phase = None
        status = "FAILED" if phase["failed"] else ("ok" if phase["ran"] else "skipped")
        took = fmt_seconds(time.monotonic() - phase["started"])
        cases = f"  ({phase['cases']} case(s) failed)" if phase["cases"] else ""
        color = "red" if phase["failed"] else None
        self._say(f"phase {phase['name']:<10} {status:<7} {took}{cases}", color=color)

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._task_started[task._uuid] = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._task_started[task._uuid] = time.monotonic()

    def v2_playbook_on_stats(self, stats) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_phase()
        for host in sorted(stats.processed):
            s = stats.summarize(host)
            self._say(
                f"hosts {host}: ok={s['ok']} changed={s['changed']} failed={s['failures']} "
                f"unreachable={s['unreachable']} skipped={s['skipped']} rescued={s['rescued']}"
            )
        if not self._last_lines:
            where = f"; run log: {self._run_dir / 'run.log'}" if self._run_dir else ""
            self._last_lines = [f"Report: not written{where}"]
        for line in self._last_lines:
            self._say(line)

    # ----------------------------------------------------------------------------- results

    def _count(self, result, failed: bool = False) -> None:
        if self._phase is not None:
            self._phase["ran"] += 0 if result._task.action in _SETUP_ACTIONS else 1
            self._phase["failed"] = self._phase["failed"] or failed

    def _remember_run_dir(self, result) -> None:
        facts = (result._result or {}).get("ansible_facts") or {}
        run_log = facts.get("quickmap_run_log")
        if run_log:
            self._run_dir = Path(str(run_log)).parent

    def _case(self, result, failed: bool) -> bool:
        """A bench_case result: print its case line; False for any other task."""
        res = result._result or {}
        if "case_dir" not in res or ("case" not in res and "case_failed" not in res):
            return False
        seconds = float(res.get("plugin_wall_s") or 0.0)
        line = case_line(str(res.get("label") or res["case_dir"]), Path(res["case_dir"]), seconds,
                         res.get("case_failed") if failed else None)  # fmt: skip
        if failed and self._phase is not None:
            self._phase["cases"] += 1
        self._say(line, color="red" if failed else None)
        return True

    def _debug(self, result) -> None:
        """Messages the roles print on purpose; report/plan paths are kept for the last lines."""
        if result._task.action not in ("debug", "ansible.builtin.debug", "ansible.legacy.debug"):
            return
        msg = (result._result or {}).get("msg")
        if msg is None:
            return
        lines = msg if isinstance(msg, list) else str(msg).splitlines()
        keep = [str(line) for line in lines]
        if any(line.startswith("Report: ") or "Plan and every command" in line for line in keep):
            # "Run <id>: <status>", "Run dir: <path>", then the report (or plan) path: the very last line
            tail = [line for line in keep if line.startswith("Report: ") or "Plan and every command" in line]
            self._last_lines = [line for line in keep if line not in tail] + tail
            return
        for line in keep:
            self._say(f"  {line}")

    def _failure(self, result, prefix: str = "FAILED") -> None:
        res = result._result or {}
        msg = first_line(res.get("msg") or res.get("stderr") or res.get("module_stderr") or "failed", 2000)
        where = f"evidence: {self._run_dir / 'run.log'}" if self._run_dir else "evidence: the output above"
        phase = self._phase["name"] if self._phase else "?"
        task = result._task.get_name()
        self._say(f"{prefix} {phase} | {result._host.get_name()} | {task}: {msg} ({where})", color="red")

    def v2_runner_on_ok(self, result) -> None:
        self._remember_run_dir(result)
        self._count(result)
        self._handle_warnings(result._result)
        if not self._case(result, failed=False):
            self._debug(result)

    def v2_runner_item_on_ok(self, result) -> None:
        self._handle_warnings(result._result)
        if not self._case(result, failed=False):
            self._debug(result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        self._count(result, failed=not ignore_errors)
        res = result._result or {}
        if "results" in res and result._task._uuid in self._items_failed:
            return  # the items already said why
        if self._case(result, failed=True) or ignore_errors:
            return
        self._failure(result)

    def v2_runner_item_on_failed(self, result) -> None:
        self._items_failed.add(result._task._uuid)
        if self._case(result, failed=True):
            return
        if result._task.ignore_errors is True:  # a templated value may still be a string here: say it
            return
        self._failure(result)

    def v2_runner_on_unreachable(self, result) -> None:
        self._count(result, failed=True)
        self._failure(result, prefix="UNREACHABLE")

    def v2_runner_on_skipped(self, result) -> None:
        pass

    def v2_runner_item_on_skipped(self, result) -> None:
        pass

    def v2_playbook_on_no_hosts_matched(self) -> None:
        pass

    # ---------------------------------------------------------------------------- progress

    def _watch_progress(self) -> None:
        """Every few seconds, while a case phase runs: a progress line per running case."""
        shown: dict[str, str] = {}
        while not self._stop.wait(self._interval):
            phase = self._phase
            if self._run_dir is None or phase is None or phase["name"] not in _CASE_PHASES:
                continue
            for label, progress in running_progress(self._run_dir, time.time()):
                line = progress_line(label, progress)
                if shown.get(label) == line:
                    continue
                shown[label] = line
                if self._tty:
                    self._display.display(f"\r\033[K{line}", newline=False)
                    self._progress_shown = True
                else:
                    self._display.display(line)
