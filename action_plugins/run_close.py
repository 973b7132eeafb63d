# Copyright: quickmap contributors
# Apache-2.0
"""Action plugin for ``run_close``: close a run that ansible-playbook left open (controller only).

A run whose ansible-playbook was interrupted (Ctrl-C) or killed (kill -9, a lost terminal) leaves its
manifest ``running`` and the case it was measuring ``running``: a state that says work is going on
when none is. ``--tags stop -e run_id=X`` (which the Ctrl-C safety net runs by itself) stops the
servers and then calls this: every ``running`` case becomes ``failed`` with error type
``INTERRUPTED`` (a resume redoes it), and the manifest is completed as ``interrupted`` with its case
counts. A run that already closed is left as it is. Uses ``analysis.state``, the one writer of
meta.json and manifest.json.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

try:
    from analysis import state
    from analysis.atomic import read_json_object
    from analysis.errors import InputError
except ImportError:  # running from a checkout whose package is not installed: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from analysis import state
    from analysis.atomic import read_json_object
    from analysis.errors import InputError

_ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "run_dir": {"type": "str", "required": True},
    "force": {"type": "bool", "default": False},
    "reason": {"type": "str", "default": "the run was interrupted while this case ran"},
}


class ActionModule(ActionBase):
    """Mark running cases failed (INTERRUPTED) and the manifest interrupted, when the run is still open."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=_ARGUMENT_SPEC)
        run_dir = Path(args["run_dir"])
        result.update(changed=False, closed=False, interrupted_cases=[], unreadable=[])
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.exists():
            result["msg"] = f"{run_dir}: no manifest.json, no run to close"
            return result
        try:
            status = read_json_object(manifest_path).get("status")
        except InputError as exc:
            status = None
            result["unreadable"].append(str(exc))
        if status != "running" and not args["force"] and status is not None:
            result["msg"] = f"{manifest_path}: status {status!r}, already closed; left as it is"
            return result
        if self._task.check_mode:
            result["msg"] = f"check mode: would close {run_dir} as interrupted"
            return result
        try:
            for _suite, case_dir in state.iter_case_dirs(run_dir):
                try:
                    meta = read_json_object(case_dir / "meta.json")
                except InputError as exc:
                    result["unreadable"].append(str(exc))
                    continue
                if meta.get("status") == "running":
                    state.mark_case_failed(case_dir, "INTERRUPTED", args["reason"])
                    result["interrupted_cases"].append(str(case_dir.relative_to(run_dir)))
            closed = state.complete_manifest(run_dir, "interrupted")
        except (OSError, InputError) as exc:
            raise AnsibleActionFail(f"cannot close {run_dir}: {exc}") from exc
        cases = result["interrupted_cases"]
        result.update(
            changed=True,
            closed=True,
            msg=f"{closed}; "
            + (
                f"{len(cases)} running case(s) marked INTERRUPTED: {', '.join(cases)}"
                if cases
                else "no case was running"
            ),
        )
        return result
