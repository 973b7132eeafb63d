#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: find one child process (the engine's scheduler) under a recorded server PID."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: process_tree
short_description: Walk the process tree of a recorded server and pick the child whose title matches
description:
  - >-
    Starts at the PID of O(record) (the engine role's start record: PID, start ticks, boot id, command
    line) after checking that this PID is still the recorded process, and walks its descendants through
    C(/proc/<pid>/task/<tid>/children). Never searches the machine by name: only our server's children
    can be chosen.
  - >-
    The chosen process is the first descendant (breadth first, lowest PID first) whose title, C(argv[0])
    of C(/proc/<pid>/cmdline), fully matches O(match) (SGLang's C(sglang::scheduler_TP0), vLLM's
    C(VLLM::EngineCore)). No match, or a record that no longer matches its process, is not a failure:
    RV(found) is false and RV(reason) says why, so the caller records an inconclusive result.
  - O(dest) gets the result as JSON (atomically); in check mode nothing is written.
version_added: "0.4.0"
author: quickmap contributors
options:
  record:
    description: The server's start record (pid, start_ticks, boot_id, cmdline), as server_process returns it.
    type: dict
    required: true
  match:
    description: Regular expression that the chosen process's title must match in full.
    type: str
    required: true
  dest:
    description: Where to write the result as JSON (omit to write nothing).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Labs | the scheduler process of this server
  process_tree:
    record: "{{ engine_start_result.record }}"
    match: "sglang::scheduler(_[A-Z0-9_]+)?"
    dest: "{{ variant_dir }}/scheduler_process.json"
"""

RETURN = r"""
found:
  description: Whether one of the server's descendants matched.
  returned: always
  type: bool
pid:
  description: The chosen process's PID (absent when none was found).
  returned: when found
  type: int
cmdline:
  description: The chosen process's command line (its argv).
  returned: when found
  type: list
  elements: str
root:
  description: The recorded server process (pid, cmdline as recorded).
  returned: always
  type: dict
tree:
  description: Every descendant of the server (pid, ppid, depth, cmdline), breadth first.
  returned: always
  type: list
  elements: dict
matches:
  description: Every descendant whose title matched (the first is chosen).
  returned: always
  type: list
  elements: dict
reason:
  description: Why nothing was chosen (empty when found).
  returned: always
  type: str
"""

import re  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_json  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.proc_identity import same_process  # noqa: E402
from ansible.module_utils.proc_tree import descendants, matching  # noqa: E402
from ansible.module_utils.redact import mask_argv  # noqa: E402

argument_spec = dict(
    record=dict(type="dict", required=True),
    match=dict(type="str", required=True),
    dest=dict(type="path"),
)


def walk(record: dict, pattern: str) -> dict:
    """The result for one record: the tree under its PID and the chosen child (or why none)."""
    pid = record.get("pid")
    result: dict = {
        "changed": False,
        "found": False,
        "root": {"pid": pid, "cmdline": record.get("cmdline")},
        "tree": [],
        "matches": [],
        "match": pattern,
        "reason": "",
    }
    ok, why = same_process(record, mask_argv)
    if not ok:
        result["reason"] = f"the recorded server is not running as recorded: {why}"
        return result
    tree = descendants(pid)
    result["tree"] = tree
    hits = matching(tree, pattern)
    result["matches"] = hits
    if not hits:
        titles = ", ".join(sorted({p["cmdline"][0] for p in tree})) or "none"
        result["reason"] = (
            f"no process under pid {pid} has a title matching {pattern!r} (its descendants' titles: {titles})"
        )
        return result
    result.update(found=True, pid=hits[0]["pid"], cmdline=hits[0]["cmdline"])
    result["msg"] = f"scheduler process {hits[0]['pid']} ({hits[0]['cmdline'][0]}) under server pid {pid}"
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    try:
        re.compile(p["match"])
    except re.error as e:
        module.fail_json(msg=f"process_tree: match={p['match']!r} is not a regular expression ({e})")
    result = walk(p["record"], p["match"])
    result.setdefault("msg", result["reason"])
    if p["dest"] and not module.check_mode:
        atomic_write_json(p["dest"], {k: v for k, v in result.items() if k not in ("changed", "msg")})
        result["changed"] = True
    module.exit_json(**result)


if __name__ == "__main__":
    main()
