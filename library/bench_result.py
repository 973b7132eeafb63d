#!/usr/bin/python
# Copyright: quickmap contributors
# Apache-2.0
"""Ansible module: validate a benchmark client's result file (the case's success test, not the exit code)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_result
short_description: Validate a benchmark client's result file against the case it was meant to run
description:
  - >-
    Reads a result file written by quickmap's loadgen (schema C(quickmap.loadgen/1)), SGLang's
    C(bench_serving) (JSONL, one object appended per run), vLLM's C(bench serve) (JSON), guidellm's
    C(benchmarks.json), AIPerf's C(profile_export_aiperf.json) or per-request C(profile_export.jsonl), or a
    console log in which one line is such a JSON object. The format is detected from the keys, not the name.
  - >-
    Passes when the file parses, the run completed (loadgen C(complete=true)), no measured value is NaN or
    Infinity, C(completed) equals O(expect_requests), and, when O(expect_output_len) is given, at least
    O(min_output_fraction) of the completed requests produced that many output tokens (with ignore_eos
    every request must reach the OSL). The rules live in C(module_utils/verdicts.py), the one judge that
    C(python -m analysis) uses too.
  - >-
    Fails with a one-line message naming the file and the broken rule, and a machine-readable
    RV(reason) (missing, empty, unparsable, truncated, incomplete, nonfinite, count, short_output) so a
    rescue can classify the case.
  - Read-only, so it runs the same in check mode. The result always has C(changed=false).
version_added: "0.1.0"
author: quickmap contributors (!UNKNOWN)
options:
  path:
    description: The result file (for example C(bench.json)), or the client log holding the JSON line.
    type: path
    required: true
  expect_requests:
    description: Number of requests the case sent in its main phase; C(completed) must equal it.
    type: int
    required: true
  expect_output_len:
    description:
      - The case's output sequence length (OSL). When set, completed requests must have produced at
        least this many output tokens (see O(min_output_fraction)).
      - >-
        Uses per-request lengths when the file has them (loadgen always; SGLang C(--output-details);
        vLLM C(--save-detailed)), otherwise C(total_output_tokens) >= fraction x completed x OSL.
    type: int
  min_output_fraction:
    description:
      - >-
        Fraction of completed requests that must reach O(expect_output_len). V(1.0) (the default) means
        every request, which is what ignore_eos guarantees; lower it for runs with C(--disable-ignore-eos).
    type: float
    default: 1.0
  record:
    description: >-
      Which run to check when a JSONL file holds several (SGLang appends). V(last) is the newest. In a
      console log the first line holding a result is checked, as C(python -m analysis) reads it.
    type: str
    choices: [last, first]
    default: last
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed status without changing the target.
    support: full
  diff_mode:
    description: Returns details on what changed (or would change in check mode) when run in diff mode.
    support: none
notes:
  - The reader lives in C(module_utils/bench_file.py) (standard library only).
"""

EXAMPLES = r"""
- name: Bench | validate the result file, not the exit code
  bench_result:
    path: "{{ bench_case_dir }}/bench.json"
    expect_requests: "{{ bench_num_prompts }}"
    expect_output_len: "{{ bench_osl }}"
  register: bench_result_check
  failed_when: false  # decide below, so the case is classified instead of aborting the play

- name: Bench | classify a bad result
  ansible.builtin.command:
    argv: [python3, -m, analysis, mark-case-failed, "{{ bench_case_dir }}", --error-type, BENCH_FAILED,
           --reason, "{{ bench_result_check.msg }}"]
  when: not bench_result_check.passed
  changed_when: true
"""

RETURN = r"""
passed:
  description: True when every rule held.
  returned: always
  type: bool
msg:
  description: One line; on failure it names the file and the rule.
  returned: always
  type: str
  sample: "/r/cases/c1/rep1/bench.json: completed 63 != expected 64 requests, failed 1"
reason:
  description: >-
    Null on success, else one of missing, empty, unparsable, truncated, incomplete, nonfinite, count,
    short_output.
  returned: always
  type: str
format:
  description: Client that wrote the result (loadgen, sglang, vllm); null when unreadable.
  returned: always
  type: str
  sample: loadgen
layout:
  description: json (one object), jsonl (one object per line), or log (JSON line among other lines).
  returned: when the file parsed
  type: str
runs_in_file:
  description: Number of result objects found (SGLang appends one per run).
  returned: when the file parsed
  type: int
completed:
  description: Requests completed successfully.
  returned: when the file parsed
  type: int
failed:
  description: Requests that failed (null when the client does not record it).
  returned: when the file parsed
  type: int
num_prompts:
  description: Requests the client says it sent (loadgen and vLLM).
  returned: when the file parsed
  type: int
complete:
  description: loadgen's complete flag (null for other clients).
  returned: when the file parsed
  type: bool
reliable:
  description: loadgen's reliable flag (null for other clients).
  returned: when the file parsed
  type: bool
duration:
  description: Main-phase duration in seconds.
  returned: when the file parsed
  type: float
output_tokens:
  description: Per-request output token stats (count, min, mean, max, total); null without per-request data.
  returned: when the file parsed
  type: dict
  sample: {count: 64, min: 128, mean: 128.0, max: 128, total: 8192}
total_output_tokens:
  description: The file's total_output_tokens.
  returned: when the file parsed
  type: int
output_check:
  description: How OSL was checked - per_request, aggregate, or skipped (no expect_output_len).
  returned: always
  type: str
short_outputs:
  description: Completed requests with fewer than expect_output_len output tokens (per_request check).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.bench_file import judge_file  # noqa: E402

argument_spec = dict(
    path=dict(type="path", required=True),
    expect_requests=dict(type="int", required=True),
    expect_output_len=dict(type="int"),
    min_output_fraction=dict(type="float", default=1.0),
    record=dict(type="str", choices=["last", "first"], default="last"),
)


def run(module: AnsibleModule) -> dict:
    """Check the arguments, then load, summarise and judge the file (``passed`` and ``msg``)."""
    p = module.params
    if p["expect_requests"] < 1:
        module.fail_json(msg=f"bench_result: expect_requests={p['expect_requests']} (rule: >= 1)")
    if p["expect_output_len"] is not None and p["expect_output_len"] < 1:
        module.fail_json(msg=f"bench_result: expect_output_len={p['expect_output_len']} (rule: >= 1)")
    if not 0.0 < p["min_output_fraction"] <= 1.0:
        module.fail_json(
            msg=f"bench_result: min_output_fraction={p['min_output_fraction']} (rule: 0 < f <= 1)"
        )
    return judge_file(
        p["path"], p["expect_requests"], p["expect_output_len"], p["min_output_fraction"], p["record"]
    )


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    result = run(module)
    if not result["passed"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
