#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: run one benchmark case on the node and judge its result file, in one task."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_case
short_description: Run one benchmark case (its saved command, under a timeout) and validate its result
description:
  - >-
    Saves O(script) as C(bench_cmd.txt) in O(case_dir) (atomically, before anything runs: the exact
    commands of the case are kept even when the run dies; a secret value is saved as C(***) by the one
    secret rule of C(module_utils/redact.py), and then the unmasked text runs from memory), runs it
    with C(bash) from that directory in
    its own session, and then judges O(result_file) by the rules of the C(bench_result) module
    (parses, C(completed) equals O(expect_requests), outputs reached O(expect_output_len)). The exit code
    of the client is recorded but never taken as success.
  - >-
    The script carries its own C(timeout) around the client; O(timeout_s) is the net above it. When it
    expires every process group of the script's session gets SIGTERM (the client under C(timeout) is in a
    group of its own), then SIGKILL after O(kill_after_s), and the result says
    RV(timed_out=true). Exit codes 124 and 137 (C(timeout)'s) also count as timed out. RV(limit) says
    which limit fired, and the message names it with its value; whatever result file the client wrote
    before it was stopped is kept and judged (its counts appear in the message).
  - >-
    On failure, when O(health_url) is given, the server is probed from the node (the address the client
    used), so a rescue can tell a dead server from a failed client; RV(server_alive) holds the answer.
  - >-
    One module run per case keeps the orchestration cost of a case to a single remote execution; the
    C(bench_case) action plugin of the same name wraps it with the controller-side meta.json writes,
    the fetch of the result and the failure classification. The work itself lives in
    C(module_utils/bench_node.py); when the head is the controller (connection local, no become, no
    environment, not async) the action plugin runs it in-process instead of shipping this module, with
    the same result (RV(node_side) of the action says which way ran).
  - In check mode nothing is written or run; the result says what would run.
version_added: "0.2.0"
author: quickmap contributors (!UNKNOWN)
options:
  case_dir:
    description: The case directory on the node (created when missing). The script runs from here.
    type: path
    required: true
  script:
    description: The case's commands (bash), saved verbatim as C(bench_cmd.txt) and run (needs O(run=true)).
    type: str
  run:
    description:
      - V(false) judges a case that already ran (a background started with C(async)) without running
        anything; O(rc) then carries that run's exit code.
    type: bool
    default: true
  rc:
    description: Exit code of the earlier run when O(run=false) (124 and 137 mean it timed out).
    type: int
  timeout_s:
    description: Seconds the script may run before its process group is terminated (the safety limit).
    type: int
    required: true
  case_timeout_s:
    description:
      - The case's own timeout, the one the script's C(timeout) enforces (bench_timeout_s or its per-case
        override). A failure names it when C(timeout) fired (exit 124/137); the safety limit O(timeout_s)
        is named only when the module had to stop the script itself.
    type: int
  kill_after_s:
    description: Grace between SIGTERM and SIGKILL when O(timeout_s) expires.
    type: int
    default: 10
  result_file:
    description: The result file the script writes, relative to O(case_dir).
    type: str
    default: bench.json
  expect_requests:
    description: Requests of the main phase; C(completed) must equal it.
    type: int
    required: true
  expect_output_len:
    description: The case's OSL; completed requests must reach it (see O(min_output_fraction)).
    type: int
  min_output_fraction:
    description: Fraction of completed requests that must reach O(expect_output_len).
    type: float
    default: 1.0
  health_url:
    description: Server health endpoint probed from the node when the case failed (empty = no probe).
    type: str
    default: ""
  bring:
    description:
      - File names in O(case_dir) to return with the answer (RV(files)), for a controller that is not
        the node; the action plugin sets it. Each name is a plain file name (no V(/)).
    type: list
    elements: str
    default: []
  controller_case_dir:
    description:
      - Action plugin (controller side) - the case directory on the controller, where C(meta.json) is written
        (running, then completed or failed) and the result is fetched to.
    type: str
    required: true
  node_is_controller:
    description:
      - Action plugin (controller side) - V(true) when the node's case directory IS O(controller_case_dir)
        (a local run), so nothing is fetched.
    type: bool
    default: true
  meta:
    description:
      - Action plugin (controller side) - the case's fields recorded in C(meta.json) (workload, command,
        plan).
    type: dict
    default: {}
  server_log:
    description:
      - Action plugin (controller side) - the server log on the node, read to classify a failure (empty =
        not read).
    type: str
    default: ""
  label:
    description: Action plugin (controller side) - the case's name in messages (empty = O(case_dir)).
    type: str
    default: ""
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - The result-file rules live in C(module_utils/bench_file.py), shared with C(bench_result).
seealso:
  - module: quickmap.serving.bench_result
"""

EXAMPLES = r"""
- name: Bench | run case c1 rep1
  bench_case:
    case_dir: /data/quickmap/run1/cases/c1/rep1
    script: "{{ lookup('ansible.builtin.template', 'case.sh.j2') }}"
    timeout_s: 900
    expect_requests: 64
    expect_output_len: 128
    health_url: http://127.0.0.1:30000/health
"""

RETURN = r"""
passed:
  description: True when the result file passed every rule (the case succeeded).
  returned: always
  type: bool
msg:
  description: One line; on failure it names the file and the broken rule, or the timeout.
  returned: always
  type: str
rc:
  description: Exit code of the case script (null when it was killed by the module's own timeout).
  returned: unless check mode
  type: int
timed_out:
  description: The client ran out of time (the module's timeout, or C(timeout)'s exit code 124/137).
  returned: always
  type: bool
limit:
  description:
    - Which limit ended the run, C(case_timeout) (the script's C(timeout)) or C(safety_limit) (this
      module); null when none.
  returned: always
  type: str
started_at:
  description: UTC ISO-8601 time the script started.
  returned: unless check mode
  type: str
ended_at:
  description: UTC ISO-8601 time the script ended.
  returned: unless check mode
  type: str
wall_s:
  description: Wall time of the script, seconds.
  returned: unless check mode
  type: float
stdout_tail:
  description: The last lines the script printed (the client itself writes to bench.log).
  returned: unless check mode
  type: str
server_alive:
  description: Whether O(health_url) answered 2xx after a failure; null when not probed.
  returned: always
  type: bool
files:
  description:
    - The O(bring) files that exist, C(inline) (name to base64 content, each up to 1 MiB) and C(large)
      (names of larger ones, which the action plugin fetches); absent ones are left out.
  returned: when O(bring) is given, unless check mode
  type: dict
reason:
  description: Null on success, else why the result file failed (missing, count, short_output, ...).
  returned: always
  type: str
duration:
  description: The client's main-phase duration (from the result file), seconds.
  returned: when the file parsed
  type: float
completed:
  description: Requests completed successfully.
  returned: when the file parsed
  type: int
node_side:
  description:
    - Action plugin (controller side) - how the node-side work ran, C(in_process) (the head is the
      controller) or C(module) (this module, shipped to the head).
  returned: unless check mode
  type: str
"""

import signal  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.bench_node import ARGUMENT_SPEC, REQUIRED_IF, run_case  # noqa: E402

# The module's options; the work is ansible.module_utils.bench_node.run_case, which the action plugin
# of the same name also calls in-process when the head is the controller.
argument_spec = ARGUMENT_SPEC


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        module = AnsibleModule(
            argument_spec=argument_spec,
            supports_check_mode=True,
            required_if=REQUIRED_IF,
        )
        result = run_case(module.params, module.check_mode)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.get("failed") or not result["passed"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
