#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Documentation of the bench_resume action (action_plugins/bench_resume.py); it runs on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_resume
short_description: Keep the completed cases of a resumed run that were measured under this configuration
description:
  - >-
    Controller-side action (C(action_plugins/bench_resume.py)); this file only documents it. For each of
    O(runs) a case is kept when it is complete (meta.json C(completed) and a result file holding every
    request, the shared test of C(analysis.state.case_done)) and the fingerprint its meta.json recorded
    equals the run's current C(fingerprint) in O(runs) (scenario row, server command without secrets, engine
    and client versions, client flags). The fact C(bench_done) (RV(ansible_facts)) lists the kept cases.
  - >-
    A completed case whose fingerprint differs fails the task with one message naming every difference
    (O(mismatch=refuse), nothing changes), or with O(mismatch=rerun) moves to C(superseded/<time>/<rel>)
    on the controller and on a remote head (O(move=true)) so that it is measured again, the old evidence
    kept. A meta.json that is not valid JSON is kept as C(meta.json.unreadable-<time>) and its case redone.
  - In check mode, or with O(move=false), nothing is moved or renamed.
version_added: "0.3.0"
author: quickmap contributors (!UNKNOWN)
options:
  runs:
    description: The runs of the plan, each C({rel, fingerprint}) (C(rel) is relative to the run directory).
    type: list
    elements: dict
    required: true
  controller_run_dir:
    description: The run directory on the controller (meta.json, bench.json of every case).
    type: str
    required: true
  node_run_dir:
    description: The run directory on the head node (where superseded cases also move).
    type: str
    required: true
  node_is_controller:
    description: The head's run directory is the controller's (nothing to move on a remote head).
    type: bool
    default: true
  resume:
    description: V(false) keeps nothing (a fresh run) and returns at once.
    type: bool
    default: true
  mismatch:
    description: What to do with a completed case measured under another configuration.
    type: str
    choices: [refuse, rerun]
    default: refuse
  ignore:
    description:
      - Fingerprint parts not compared (preflight leaves out C(engine_version), known only once the
        server runs).
    type: list
    elements: str
    default: []
  move:
    description: Move superseded cases and rename unreadable meta.json (V(false) only checks).
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Bench | keep the completed cases measured under this configuration (resume)
  bench_resume:
    runs: "{{ lookup('ansible.builtin.template', 'fingerprints.j2') | from_json }}"
    controller_run_dir: /srv/quickmap/results/run1
    node_run_dir: /var/tmp/quickmap/results/run1
    node_is_controller: false
    mismatch: refuse
"""

RETURN = r"""
ansible_facts:
  description: C(bench_done), the rel dirs of the kept cases.
  returned: unless the task failed
  type: dict
kept:
  description: Cases kept (complete, same fingerprint).
  returned: always
  type: list
  elements: str
mismatched:
  description: Completed cases measured under another configuration, each with its C(differences).
  returned: always
  type: list
  elements: dict
superseded:
  description: Where each mismatched case moved (relative to the run directory), with O(mismatch=rerun).
  returned: always
  type: list
  elements: str
unreadable:
  description: meta.json files that could not be read (kept aside, their cases redone).
  returned: always
  type: list
  elements: str
msg:
  description: One line; on a refusal it names every difference and the rule.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

argument_spec = dict(
    runs=dict(type="list", elements="dict", required=True),
    controller_run_dir=dict(type="str", required=True),
    node_run_dir=dict(type="str", required=True),
    node_is_controller=dict(type="bool", default=True),
    resume=dict(type="bool", default=True),
    mismatch=dict(type="str", choices=["refuse", "rerun"], default="refuse"),
    ignore=dict(type="list", elements="str", default=[]),
    move=dict(type="bool", default=True),
)


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    module.fail_json(
        msg="bench_resume runs on the controller as an action plugin (action_plugins/bench_resume.py)"
    )


if __name__ == "__main__":
    main()
