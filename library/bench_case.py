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
    its own process group, and then judges O(result_file) by the rules of the C(bench_result) module
    (parses, C(completed) equals O(expect_requests), outputs reached O(expect_output_len)). The exit code
    of the client is recorded but never taken as success.
  - >-
    The script carries its own C(timeout) around the client; O(timeout_s) is the net above it. When it
    expires the whole process group gets SIGTERM, then SIGKILL after O(kill_after_s), and the result says
    RV(timed_out=true). Exit codes 124 and 137 (C(timeout)'s) also count as timed out. RV(limit) says
    which limit fired, and the message names it with its value; whatever result file the client wrote
    before it was stopped is kept and judged (its counts appear in the message).
  - >-
    On failure, when O(health_url) is given, the server is probed from the node (the address the client
    used), so a rescue can tell a dead server from a failed client; RV(server_alive) holds the answer.
  - >-
    One module run per case keeps the orchestration cost of a case to a single remote execution; the
    C(bench_case) action plugin of the same name wraps it with the controller-side meta.json writes,
    the fetch of the result and the failure classification.
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
"""

import contextlib  # noqa: E402
import datetime as dt  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.atomic_write import atomic_write_text  # noqa: E402
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.bench_file import judge_file  # noqa: E402
from ansible.module_utils.redact import redact_text  # noqa: E402

argument_spec = dict(
    case_dir=dict(type="path", required=True),
    script=dict(type="str"),
    run=dict(type="bool", default=True),
    rc=dict(type="int"),
    timeout_s=dict(type="int", required=True),
    case_timeout_s=dict(type="int"),
    kill_after_s=dict(type="int", default=10),
    result_file=dict(type="str", default="bench.json"),
    expect_requests=dict(type="int", required=True),
    expect_output_len=dict(type="int"),
    min_output_fraction=dict(type="float", default=1.0),
    health_url=dict(type="str", default=""),
)

_TIMEOUT_RCS = (124, 137)
_STDOUT_TAIL_BYTES = 4096


def _utc_now() -> str:
    # dt.UTC is 3.11+; module code runs on the nodes' python (3.8+)
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"  # noqa: UP017


def _healthy(url: str) -> bool:
    import urllib.error  # only after a failure: keeps the module's start-up short
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # our own server: no proxy
    try:
        with opener.open(url, timeout=5) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def run_script(case_dir: str, timeout_s: int, kill_after_s: int, text: str | None = None) -> dict:
    """Run bench_cmd.txt (or ``text`` on stdin) in its own process group; on timeout TERM then KILL it."""
    started_at, t0 = _utc_now(), time.monotonic()
    proc = subprocess.Popen(
        ["bash", "bench_cmd.txt"] if text is None else ["bash", "-s"],
        cwd=case_dir,
        stdin=subprocess.DEVNULL if text is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    killed = False
    try:
        out, _ = proc.communicate(input=None if text is None else text.encode("utf-8"), timeout=timeout_s)
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM) of the run: the client lives in its own session and would run on after
        # this module is gone. Stop it the way its timeout would, so it writes what it measured.
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
        raise
    except subprocess.TimeoutExpired:
        killed = True
        _signal_group(proc, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=kill_after_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            out, _ = proc.communicate()
    rc = None if killed else proc.returncode
    return {
        "rc": rc,
        "timed_out": killed or rc in _TIMEOUT_RCS,
        "limit": "safety_limit" if killed else ("case_timeout" if rc in _TIMEOUT_RCS else None),
        "started_at": started_at,
        "ended_at": _utc_now(),
        "wall_s": round(time.monotonic() - t0, 3),
        "stdout_tail": out[-_STDOUT_TAIL_BYTES:].decode("utf-8", "replace"),
    }


def check_args(p: dict) -> str | None:
    """The first rule a parameter breaks, as one line naming the value; None when all hold."""
    if p["timeout_s"] < 1:
        return f"bench_case: timeout_s={p['timeout_s']} (rule: >= 1 second)"
    if p["case_timeout_s"] is not None and not 1 <= p["case_timeout_s"] <= p["timeout_s"]:
        return (
            f"bench_case: case_timeout_s={p['case_timeout_s']} "
            f"(rule: 1 <= case_timeout_s <= timeout_s={p['timeout_s']})"
        )
    if p["kill_after_s"] < 0:
        return f"bench_case: kill_after_s={p['kill_after_s']} (rule: >= 0)"
    if p["expect_requests"] < 1:
        return f"bench_case: expect_requests={p['expect_requests']} (rule: >= 1)"
    if p["expect_output_len"] is not None and p["expect_output_len"] < 1:
        return f"bench_case: expect_output_len={p['expect_output_len']} (rule: >= 1)"
    if not 0.0 < p["min_output_fraction"] <= 1.0:
        return f"bench_case: min_output_fraction={p['min_output_fraction']} (rule: 0 < f <= 1)"
    if os.path.isabs(p["result_file"]) or ".." in p["result_file"].split("/"):
        return f"bench_case: result_file={p['result_file']!r} (rule: a path inside case_dir)"
    return None


def limit_message(p: dict, limit: str | None) -> str:
    """Which limit stopped the client, with the value that was configured for it."""
    case_limit = p["case_timeout_s"]
    if limit == "safety_limit":
        given = f"case timeout {case_limit} s + grace" if case_limit else "case timeout + grace"
        return (
            f"the case script ran past the safety limit of {p['timeout_s']} s ({given}): the client's own "
            "timeout did not end it, so its process group was stopped"
        )
    if case_limit:
        return (
            f"the client ran past its case timeout of {case_limit} s "
            "(bench_timeout_s / bench_case_timeouts) and was stopped"
        )
    return "the client ran past its case timeout and was stopped (exit code of timeout)"


def run(module: AnsibleModule) -> dict:
    """Save the command, run it, judge the result file; ``passed`` says whether the case succeeded."""
    p = module.params
    problem = check_args(p)
    if problem:
        module.fail_json(msg=problem)
    case_dir = p["case_dir"]
    if module.check_mode:
        return {
            "changed": False,
            "passed": True,
            "timed_out": False,
            "limit": None,
            "server_alive": None,
            "reason": None,
            "msg": f"check mode: would save and run {case_dir}/bench_cmd.txt",
        }
    if p["run"]:
        # Saved through the one secret rule; when it masked something the real text runs from memory.
        saved = redact_text(p["script"])
        atomic_write_text(os.path.join(case_dir, "bench_cmd.txt"), saved)
        ran = run_script(
            case_dir, p["timeout_s"], p["kill_after_s"], None if saved == p["script"] else p["script"]
        )
    else:
        timed_out = p["rc"] in _TIMEOUT_RCS
        ran = {"rc": p["rc"], "timed_out": timed_out, "limit": "case_timeout" if timed_out else None}
    result = judge_file(
        os.path.join(case_dir, p["result_file"]),
        p["expect_requests"],
        p["expect_output_len"],
        p["min_output_fraction"],
    )
    result.update(ran, changed=True, server_alive=None)
    if ran["timed_out"]:
        result.update(passed=False, msg=f"{case_dir}: {limit_message(p, ran['limit'])}; {result['msg']}")
    if not result["passed"] and p["health_url"]:
        result["server_alive"] = _healthy(p["health_url"])
    return result


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        module = AnsibleModule(
            argument_spec=argument_spec,
            supports_check_mode=True,
            required_if=[("run", True, ("script",))],
        )
        result = run(module)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not result["passed"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
