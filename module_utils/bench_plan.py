# Copyright: quickmap contributors
# Apache-2.0
"""The bench plan as case runs, and the time limits of each run: built once, in Python.

The roles read what this module returns and compute nothing themselves. Before, the expansion into
runs (repetitions, the prompt cap) was written in Jinja templates and the sum "case timeout + grace +
margin" was spelled in five task fields, with three different margins nobody had named.

A run is the plan's case row plus ``suite``, ``rep``, ``num_prompts`` (after the cap and the per-case
override), ``rel`` (its stable directory under the run) and ``timeouts`` (:func:`case_timeouts`).
The resume fingerprint leaves ``timeouts`` out: a time limit does not change what a case measures.

Called on the controller by the ``quickmap_bench_runs``/``quickmap_mixed_runs``/``quickmap_case_timeouts``
filters (filter_plugins/bench_plan.py). Standard library only.
"""

from __future__ import annotations

from typing import Any

# The limits nested around one case, innermost first. The client runs under `timeout -k KILL CASE`;
# everything above it is a net that only fires when the layer below did not end the case.
#
# MODULE_NET_S: the bench_case module's own deadline above the script's `timeout -k` (the script also
#   scrapes /metrics twice, 5 s each at most, and the pace call): the module then kills the group.
MODULE_NET_S = 30
# POLL_NET_S: a background case (async + poll 0) is joined by async_status polls one second apart;
#   this many seconds of polls beyond the client's limit, so the module's net fires first.
POLL_NET_S = 60
# TASK_NET_S: Ansible's own task `timeout` and the async job's budget, the last resort above the
#   module (a hung connection, a module that never returns); larger than the two nets above.
TASK_NET_S = 120
# The A/B's three runs of one repetition, in the order they run.
MIXED_ROLES = ("control", "decode_background", "prefill_injection")


def _as_int(value: Any, default: int = 0) -> int:
    """Jinja's ``int`` filter, as the templates applied it: "3" -> 3, "3.0" -> 3, garbage -> 0."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def case_timeouts(case_timeout_s: Any, kill_after_s: Any, clients: Any = 1) -> dict[str, int]:
    """Every time limit of one case run, from its own timeout and the TERM -> KILL grace.

    ``case_s``/``kill_after_s``: each client's ``timeout -k``; ``module_s``: the bench_case module's
    deadline; ``poll_retries``: async_status polls (1 s apart) of a background case; ``task_s``: the
    task ``timeout`` and the async budget. ``clients``: how many clients the case runs one after the
    other (2 with a reference client beside loadgen), each under its own limit, so the nets above them
    cover all of them. See the *_NET_S constants for why each margin is what it is.
    """
    case_s = _as_int(case_timeout_s)
    kill_s = _as_int(kill_after_s)
    clients_s = max(_as_int(clients), 1) * (case_s + kill_s)
    return {
        "case_s": case_s,
        "kill_after_s": kill_s,
        "module_s": clients_s + MODULE_NET_S,
        "poll_retries": clients_s + POLL_NET_S,
        "task_s": clients_s + TASK_NET_S,
    }


def _timeouts_of(
    case_id: str, per_case: dict | None, timeout_s: Any, kill_after_s: Any, clients: Any = 1
) -> dict[str, int]:
    per_case = per_case or {}
    return case_timeouts(per_case.get(case_id, timeout_s), kill_after_s, clients)


def fixed_runs(
    plan: list[dict],
    repetitions: Any,
    num_prompts_cap: Any = 0,
    case_num_prompts: dict | None = None,
    per_case_timeouts: dict | None = None,
    timeout_s: Any = 900,
    kill_after_s: Any = 10,
    clients: Any = 1,
) -> list[dict]:
    """The fixed suite: every case of ``plan`` (validate-scenarios' rows, already filtered by
    case_ids) x repetitions 1..N, in table order, each in ``cases/<case_id>/rep<N>``.

    ``num_prompts``: the row's, capped by ``num_prompts_cap`` when it is > 0, then replaced by the
    case's ``case_num_prompts`` entry when there is one. ``clients``: 2 when a reference client runs
    after loadgen in every fixed case (the mixed A/B never runs a second client).
    """
    cap = _as_int(num_prompts_cap)
    overrides = case_num_prompts or {}
    runs = []
    for row in plan:
        case_id = row["case_id"]
        num_prompts = _as_int(row.get("num_prompts"))
        if cap > 0:
            num_prompts = min(num_prompts, cap)
        if case_id in overrides:
            num_prompts = _as_int(overrides[case_id])
        timeouts = _timeouts_of(case_id, per_case_timeouts, timeout_s, kill_after_s, clients)
        for rep in range(1, _as_int(repetitions) + 1):
            run = dict(row)
            run.update(
                suite="fixed",
                rep=rep,
                num_prompts=num_prompts,
                rel=f"cases/{case_id}/rep{rep}",
                timeouts=dict(timeouts),
            )
            runs.append(run)
    return runs


def mixed_runs(
    decode: dict,
    injection: dict,
    repetitions: Any,
    per_case_timeouts: dict | None = None,
    timeout_s: Any = 900,
    kill_after_s: Any = 10,
) -> list[dict]:
    """The mixed A/B: per repetition control, decode_background (both of the ``decode`` shape) and
    prefill_injection (the ``injection`` shape), in ``mixed/rep<N>/<role>``."""
    runs = []
    for rep in range(1, _as_int(repetitions) + 1):
        for role in MIXED_ROLES:
            shape = injection if role == "prefill_injection" else decode
            case_id = f"mixed_{role}"
            run = dict(shape)
            run.update(
                case_id=case_id,
                stage="mixed",
                suite="mixed",
                role=role,
                rep=rep,
                note=f"mixed A/B {role}",
                rel=f"mixed/rep{rep}/{role}",
                timeouts=_timeouts_of(case_id, per_case_timeouts, timeout_s, kill_after_s),
            )
            runs.append(run)
    return runs
