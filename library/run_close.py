#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Documentation of the run_close action (action_plugins/run_close.py); it runs on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_close
short_description: Close a run that ansible-playbook left open (interrupted or killed)
description:
  - >-
    Controller-side action (C(action_plugins/run_close.py)); this file only documents it. When the run's
    manifest.json still says C(running) (or O(force=true)), every case whose meta.json says C(running)
    becomes C(failed) with error type C(INTERRUPTED) and O(reason), and the manifest is completed as
    C(interrupted) with its case counts. A closed run is left as it is; unreadable meta.json files are
    reported, never fatal.
  - In check mode nothing is written.
version_added: "0.3.0"
author: quickmap contributors (!UNKNOWN)
options:
  run_dir:
    description: The run directory on the controller.
    type: str
    required: true
  force:
    description:
      - Close even when the manifest says otherwise (the Ctrl-C safety net knows the run was interrupted).
    type: bool
    default: false
  reason:
    description: The reason written into each interrupted case's meta.json.
    type: str
    default: the run was interrupted while this case ran
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Stop | close the run left open
  run_close:
    run_dir: /srv/quickmap/results/run1
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
closed:
  description: True when this call closed the run (then a report of what it measured is due).
  returned: always
  type: bool
interrupted_cases:
  description: Case directories (relative to the run) that were running and are now failed INTERRUPTED.
  returned: always
  type: list
  elements: str
unreadable:
  description: Files that could not be read (reported, not fatal).
  returned: always
  type: list
  elements: str
msg:
  description: One-line summary.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

argument_spec = dict(
    run_dir=dict(type="str", required=True),
    force=dict(type="bool", default=False),
    reason=dict(type="str", default="the run was interrupted while this case ran"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    module.fail_json(msg="run_close runs on the controller as an action plugin (action_plugins/run_close.py)")


if __name__ == "__main__":
    main()
