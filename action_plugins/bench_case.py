# Copyright: quickmap contributors
# Apache-2.0
"""Action plugin for ``bench_case``: one task = one whole case, controller side and node side.

The module of the same name runs on the node (save bench_cmd.txt, run it under a timeout, judge the
result file). This plugin wraps it with what belongs to the controller: meta.json (running, then
completed or failed), the fetch of bench.json from a remote head, and the failure classification
from the client log, the server log and the node's liveness probe. Doing all of it in one task is
what keeps Ansible's cost per case low (each task costs a worker fork and, on a remote head, an SSH
round trip).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

try:
    from analysis import atomic, state
    from analysis.atomic import read_json_object
    from module_utils import bench_node, emulation_verdict
except ImportError:  # running from a checkout whose package is not installed: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from analysis import atomic, state
    from analysis.atomic import read_json_object
    from module_utils import bench_node, emulation_verdict

_MODULE_ARGS = (
    "case_dir",
    "script",
    "run",
    "rc",
    "timeout_s",
    "case_timeout_s",
    "kill_after_s",
    "result_file",
    "expect_requests",
    "expect_output_len",
    "min_output_fraction",
    "health_url",
)
_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "case_dir": {"type": "str", "required": True},
    "script": {"type": "str"},
    "run": {"type": "bool", "default": True},
    "rc": {"type": "int"},
    "timeout_s": {"type": "int", "required": True},
    "case_timeout_s": {"type": "int"},
    "kill_after_s": {"type": "int", "default": 10},
    "result_file": {"type": "str", "default": "bench.json"},
    "expect_requests": {"type": "int", "required": True},
    "expect_output_len": {"type": "int"},
    "min_output_fraction": {"type": "float", "default": 1.0},
    "health_url": {"type": "str", "default": ""},
    "controller_case_dir": {"type": "str", "required": True},
    "node_is_controller": {"type": "bool", "default": True},
    "meta": {"type": "dict", "default": {}},
    "server_log": {"type": "str", "default": ""},
    "label": {"type": "str", "default": ""},
}
# An emulated case's evidence: the /metrics scrapes around it and the pace answer (enginesim only).
_EMULATION_FILES = ("metrics_before.prom", "metrics_after.prom", "pace.json")
# The reference client's files beside bench.json (bench_client / bench_cross_check); absent ones are skipped.
_REFERENCE_FILES = tuple(
    f"bench_{client}.{ext}" for client in ("sglang", "vllm") for ext in ("json", "jsonl", "log", "rc")
) + tuple(  # and each reference client's own /metrics window (the emulator's verdict on its run)
    f"metrics_{when}_{client}.prom" for client in ("sglang", "vllm") for when in ("before", "after")
)


def _emulation(case_dir: Path) -> dict | None:
    """The emulator's realtime verdict for meta.json (None for a real engine), by the one judge."""
    try:
        return emulation_verdict.read_case(str(case_dir))
    except ValueError as exc:  # a scrape prometheus_client cannot parse
        return {"emulated": True, "verdict": "unknown", "reasons": [f"unparsable /metrics scrape: {exc}"]}


# Module results that are noise in meta.json and the play output. AnsibleModule.exit_json adds the
# file attributes of a result's `path` (the result file's owner, mode, size...): nothing reads them,
# and the in-process path has none, so they go too (one result either way).
_PATH_INFO = ("uid", "gid", "owner", "group", "mode", "state", "size", "secontext")
# (files: the case files the module brought back inline, written to the controller case dir, not logged)
_DROP = ("invocation", "_ansible_no_log", "_ansible_parsed", "changed", "failed", "files", *_PATH_INFO)


def _case_files(args: dict) -> list[str]:
    """The case files a completed case brings to the controller (the module returns them with its answer)."""
    return [args["result_file"], "bench.log", *_EMULATION_FILES, *_REFERENCE_FILES]


class ActionModule(ActionBase):
    """Run one benchmark case: meta(running) -> bench_case module on the node -> fetch -> meta."""

    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        started = time.time()
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=_ARGUMENT_SPEC)
        label = args["label"] or args["case_dir"]
        ctrl_dir = Path(args["controller_case_dir"])
        if self._task.check_mode:
            result.update(changed=False, msg=f"check mode: case {label} not run")
            return result
        # A case that already ran (run=false: a joined background) gets its meta fields at the end.
        # Plain str/int/... (Ansible hands over tagged str subclasses, which orjson refuses as keys).
        meta = json.loads(json.dumps(args["meta"]))
        final_meta = {} if args["run"] else dict(meta)
        if args["run"]:
            try:
                ctrl_dir.mkdir(parents=True, exist_ok=True)
                state.write_case(ctrl_dir, "running", meta)
            except (OSError, state.InputError) as exc:
                raise AnsibleActionFail(f"case {label}: cannot write {ctrl_dir}/meta.json: {exc}") from exc

        module_args = {k: args[k] for k in _MODULE_ARGS if args[k] is not None}
        if not args["node_is_controller"]:  # the case files come back with the module's answer
            module_args["bring"] = _case_files(args)
        if self._in_process_ok():
            result["node_side"] = "in_process"
            ran = _run_in_process(module_args)
        else:
            result["node_side"] = "module"
            ran = self._execute_module(
                module_name="bench_case", module_args=module_args, task_vars=task_vars or {}
            )
        case = {k: v for k, v in ran.items() if k not in _DROP}
        if "module_stdout" not in ran:  # fail_json's error summary of a refused or failed case: no crash
            case.pop("exception", None)
        result["case"] = case
        result["changed"] = True
        closed = self._closed_meanwhile(ctrl_dir)
        if closed:
            # `--tags stop` closed the run while this case ran (ansible-playbook was killed, this worker
            # lived on): the case stays INTERRUPTED, as the closed manifest counted it.
            result.update(
                failed=True,
                msg=f"case {label}: {closed}",
                case_failed={"rel": label, "error_type": "INTERRUPTED", "reason": closed},
            )
        elif ran.get("passed") and not ran.get("failed"):
            self._bring(args, ran, _case_files(args))
            if "started_at" in ran:
                final_meta.update(started_at=ran["started_at"], ended_at=ran["ended_at"])
            if args["min_output_fraction"] != 1.0:  # resume and summarize judge by the same rule
                final_meta["min_output_fraction"] = args["min_output_fraction"]
            emulation = _emulation(ctrl_dir)
            if emulation is not None:
                final_meta["emulation"] = emulation
            state.write_case(ctrl_dir, "completed", final_meta)
            result["msg"] = ran.get("msg", "")
        else:
            result.update(self._record_failure(args, ran, label, final_meta))
        result["plugin_wall_s"] = round(time.time() - started, 3)
        result.update(case_dir=str(ctrl_dir), label=label)  # the console callback's case line
        result["plugin_ended_epoch_s"] = round(time.time(), 3)
        return result

    def _in_process_ok(self) -> bool:
        """Whether the node side may run in this process: the head is the controller, nothing differs.

        The module path costs an AnsiballZ build, a Python start and module_utils.basic's import per
        case (~1.5 s); in-process it is a function call. Only where the module would run here anyway,
        as this user, with this environment, in the foreground, and where a signal handler can be set.
        """
        task = self._task
        return (
            getattr(self._connection, "transport", None) == "local"
            and not self._play_context.become
            and not any(env for env in (task.environment or []) if env)
            and not task.async_val
            and threading.current_thread() is threading.main_thread()
        )

    @staticmethod
    def _closed_meanwhile(ctrl_dir: Path) -> str | None:
        """The reason when the run was closed (case marked INTERRUPTED) while this case ran."""
        try:
            meta = read_json_object(ctrl_dir / "meta.json")
        except (OSError, state.InputError):
            return None
        if meta.get("status") == "failed" and meta.get("error_type") == "INTERRUPTED":
            return f"closed as INTERRUPTED while it ran ({meta.get('reason')}); left as it is"
        return None

    def _bring(self, args: dict, ran: dict, names: list[str]) -> list[str]:
        """Bring case files from a remote head into the controller case dir: those the module returned
        inline are written, larger ones fetched, absent ones skipped (named in the returned problems);
        the server log (outside the case dir) is fetched."""
        if args["node_is_controller"]:
            return []
        files = ran.get("files") or {}
        inline, large = files.get("inline") or {}, set(files.get("large") or [])
        ctrl = args["controller_case_dir"]
        problems = []
        for name in names:
            if name in inline:
                try:
                    atomic.write_bytes(os.path.join(ctrl, name), base64.b64decode(inline[name]))
                except (OSError, ValueError) as exc:
                    problems.append(f"{name}: {exc}")
                continue
            if files and name != "server_log" and name not in large:  # listed as absent: no transfer
                problems.append(f"{os.path.join(args['case_dir'], name)}: absent on the node")
                continue
            src = args["server_log"] if name == "server_log" else os.path.join(args["case_dir"], name)
            dest = "server_log_at_failure.log" if name == "server_log" else name
            try:
                self._connection.fetch_file(src, os.path.join(ctrl, dest))
            except Exception as exc:
                problems.append(f"{src}: {exc}")
        return problems

    def _record_failure(self, args: dict, ran: dict, label: str, final_meta: dict) -> dict:
        """Bring the evidence, classify, mark meta failed; the item fails (the role decides policy)."""
        missed = self._bring(args, ran, [args["result_file"], "bench.log", "server_log"])
        ctrl_dir = Path(args["controller_case_dir"])
        if args["node_is_controller"]:
            server_log = args["server_log"] or None
        else:
            server_log = str(ctrl_dir / "server_log_at_failure.log")
        if "passed" not in ran:  # the module itself did not run (unreachable host, crash)
            error_type, evidence = "BENCH_FAILED", "the bench_case module did not return a verdict"
        else:
            error_type, evidence = state.classify_failure(
                ctrl_dir,
                server_log,
                args["health_url"] or None,
                bool(ran.get("timed_out")),
                server_alive=ran.get("server_alive"),
            )
        reason = str(ran.get("msg") or "case failed").splitlines()[0]
        if "started_at" in ran:
            final_meta.update(started_at=ran["started_at"], ended_at=ran["ended_at"])
        state.mark_case_failed(ctrl_dir, error_type, reason, final_meta)
        return {
            "failed": True,
            "msg": f"case {label} failed ({error_type}): {reason} [{evidence}]",
            "case_failed": {
                "rel": label,
                "error_type": error_type,
                "reason": reason,
                "evidence": evidence,
                "evidence_not_fetched": missed,
            },
        }


class _Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM reached the worker while a case ran in-process; ``signum`` is re-sent after."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Latch:
    """Raises on the first SIGINT/SIGTERM only: a later one (Ansible terminating its workers after a
    Ctrl-C) must not cut the stop of the case's processes short."""

    def __init__(self) -> None:
        self.first: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.first is None:
            self.first = signum
            raise _Interrupted(signum)


def _run_in_process(module_args: dict) -> dict:
    """bench_node.run_case in this worker, with the result the module would have returned.

    The worker's own SIGINT/SIGTERM handler ends the worker at once; while the case runs, the signal
    instead raises here, so run_script stops every process group of the case's session first. Then
    the worker's handler gets the signal as it would have.
    """
    validated = ArgumentSpecValidator(bench_node.ARGUMENT_SPEC, required_if=bench_node.REQUIRED_IF).validate(
        module_args
    )
    if validated.error_messages:
        return {"failed": True, "msg": validated.errors.msg}
    latch = _Latch()
    previous = {sig: signal.signal(sig, latch) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        ran = bench_node.run_case(validated.validated_parameters)
    except _Interrupted:
        ran = {"failed": True, "msg": f"bench_case: interrupted by signal {latch.first}"}
    except Exception as exc:  # the module path reports a crash as a failed result, so does this one
        ran = {"failed": True, "msg": f"bench_case (in-process) failed: {exc!r}"}
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if latch.first is not None:
        os.kill(os.getpid(), latch.first)  # the worker's handler: it ends the worker as it would have
    if not ran.get("passed"):
        ran["failed"] = True
    return ran
