# Copyright: quickmap contributors
# Apache-2.0
"""Action plugin for ``bench_resume``: which cases of a resumed run are kept, in one task.

A case is kept only when it is complete (the shared "is this case complete?" test of
``analysis.state.case_done``: meta completed AND a result file holding every request) and it was
measured under the configuration of this run: the fingerprint its meta.json recorded equals the
current one (scenario row, server command without secrets, engine and client versions, client flags).
Otherwise a resume would relabel numbers measured under one configuration with another.

A completed case whose fingerprint differs is refused (the task fails naming every difference and
changes nothing) or, with ``mismatch: rerun``, moved to ``superseded/<time>/<rel>`` (on the controller
and on a remote head) so that it is measured again while the old evidence stays. A meta.json that is
not JSON is kept as ``meta.json.unreadable-<time>`` and its case is redone.
"""

from __future__ import annotations

import difflib
import os
import shlex
import sys
import time
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
    "runs": {"type": "list", "elements": "dict", "required": True},
    "controller_run_dir": {"type": "str", "required": True},
    "node_run_dir": {"type": "str", "required": True},
    "node_is_controller": {"type": "bool", "default": True},
    "resume": {"type": "bool", "default": True},
    "mismatch": {"type": "str", "choices": ["refuse", "rerun"], "default": "refuse"},
    "ignore": {"type": "list", "elements": "str", "default": []},
    "move": {"type": "bool", "default": True},
}
_RULE = (
    "rule: resume keeps a case only when it was measured under the same scenario row, server command, "
    "engine and client; -e resume_mismatch=rerun redoes such cases and keeps the old ones under superseded/"
)


def _words_changed(old: str, new: str) -> str:
    """The changed word spans of two long strings, e.g. ``'0.9' -> '0.5'``."""
    a, b = old.split(), new.split()
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            flag = f"{a[i1 - 1]} " if i1 > 0 and a[i1 - 1].startswith("-") else ""
            parts.append(
                f"{flag}{' '.join(a[i1:i2]) or '(nothing)'!r} -> {' '.join(b[j1:j2]) or '(nothing)'!r}"
            )
    return "; ".join(parts) or f"{old!r} -> {new!r}"


def differences(old: Any, new: dict, ignore: list[str]) -> list[str]:
    """Each part of the fingerprint that differs, as ``part: old -> new``."""
    if not isinstance(old, dict):
        return ["no fingerprint recorded (measured before fingerprints were kept)"]
    out = []
    for key in sorted(set(old) | set(new)):
        if key in ignore or old.get(key) == new.get(key):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{key}.{k}: {a.get(k)!r} -> {b.get(k)!r}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        elif isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 60:
            out.append(f"{key}: {_words_changed(a, b)}")
        else:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


class ActionModule(ActionBase):
    """Keep complete cases measured under this configuration; refuse or supersede the others."""

    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=_ARGUMENT_SPEC)
        result.update(changed=False, kept=[], mismatched=[], superseded=[], unreadable=[])
        if not args["resume"]:
            result["ansible_facts"] = {"bench_done": []}
            result["msg"] = "not a resume: every case runs"
            return result
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        ctrl = Path(args["controller_run_dir"])
        for run in args["runs"]:
            rel = str(run["rel"])
            case_dir = ctrl / rel
            if not (case_dir / "meta.json").exists():
                continue
            try:
                meta = read_json_object(case_dir / "meta.json")
                code, _msg = state.case_done(case_dir, None)
            except InputError as exc:
                result["unreadable"].append(f"{rel}: {exc}")
                if args["move"] and not self._task.check_mode:
                    self._quarantine(case_dir / "meta.json", stamp)
                    result["changed"] = True
                continue
            if code != 0:
                continue
            diff = differences(meta.get("fingerprint"), run.get("fingerprint") or {}, args["ignore"])
            if not diff:
                result["kept"].append(rel)
                continue
            result["mismatched"].append({"rel": rel, "differences": diff})
        if result["mismatched"] and args["mismatch"] == "refuse":
            lines = [f"{m['rel']}: {'; '.join(m['differences'])}" for m in result["mismatched"]]
            result.update(
                failed=True,
                msg=f"resume refused: {len(lines)} completed case(s) were measured under another "
                "configuration: " + " | ".join(lines) + f" ({_RULE})",
            )
            return result
        if args["move"] and not self._task.check_mode:
            for m in result["mismatched"]:
                result["superseded"].append(self._supersede(args, m["rel"], stamp))
                result["changed"] = True
        result["ansible_facts"] = {"bench_done": result["kept"]}
        redo = [m["rel"] for m in result["mismatched"]]
        result["msg"] = (
            f"kept {len(result['kept'])} completed case(s)"
            + (f"; rerun {len(redo)} measured under another configuration: {', '.join(redo)}" if redo else "")
            + (
                f"; {len(result['unreadable'])} unreadable meta.json kept aside"
                if result["unreadable"]
                else ""
            )
        )
        return result

    @staticmethod
    def _quarantine(meta_path: Path, stamp: str) -> None:
        os.replace(meta_path, meta_path.with_name(f"meta.json.unreadable-{stamp}"))

    def _supersede(self, args: dict, rel: str, stamp: str) -> str:
        """Move the case directory to superseded/<stamp>/<rel> on the controller and on a remote head."""
        dest_rel = f"superseded/{stamp}/{rel}"
        src, dest = Path(args["controller_run_dir"]) / rel, Path(args["controller_run_dir"]) / dest_rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dest)
        if not args["node_is_controller"]:
            node_src = os.path.join(args["node_run_dir"], rel)
            node_dest = os.path.join(args["node_run_dir"], dest_rel)
            cmd = (
                f"if [ -e {shlex.quote(node_src)} ]; then mkdir -p {shlex.quote(os.path.dirname(node_dest))} "
                f"&& mv {shlex.quote(node_src)} {shlex.quote(node_dest)}; fi"
            )
            res = self._low_level_execute_command(cmd)
            if res.get("rc") != 0:
                raise AnsibleActionFail(
                    f"cannot move {node_src} to {node_dest} on the head: {res.get('stderr')}"
                )
        return dest_rel
