"""The bench plan is built once, in Python (module_utils/bench_plan.py), and gives the runs the roles'
Jinja templates gave before, plus each run's time limits.

The old templates are kept under tests/roles/legacy/ and rendered here with Ansible's own templating,
so the comparison is against exactly what the roles produced (scenario tables and site values of
inventory/*, and the edge cases: repetitions 1/3, a prompt cap below and above num_prompts, a per-case
prompt count, a case_ids filter, the mixed A/B).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from module_utils import bench_plan  # noqa: E402

LEGACY = Path(__file__).with_name("legacy")
INVENTORIES = ("local", "dual")


def _render(template: str, variables: dict[str, Any]) -> list[dict]:
    text = (LEGACY / template).read_text()
    return json.loads(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(text)))


def _scenario_rows(case_ids: str | None = None) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "analysis",
        "validate-scenarios",
        str(REPO / "scenarios" / "quick_map.tsv"),
        "--json",
    ]
    if case_ids:
        cmd += ["--case-ids", case_ids]
    return json.loads(subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout)


def _site(inventory: str) -> dict[str, Any]:
    """Role defaults overlaid with the inventory's literal values (templated ones keep the default)."""
    out: dict[str, Any] = {}
    for path in (
        REPO / "roles" / "bench" / "defaults" / "main.yml",
        REPO / "roles" / "mixed" / "defaults" / "main.yml",
        REPO / "inventory" / inventory / "group_vars" / "all.yml",
    ):
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if not (isinstance(value, str) and "{{" in value):
                out[key] = value
    return out


def _without_timeouts(runs: list[dict]) -> list[dict]:
    return [{k: v for k, v in run.items() if k != "timeouts"} for run in runs]


def _fixed_both(rows: list[dict], reps: int, cap: int, per_case: dict) -> tuple[list[dict], list[dict]]:
    old = _render(
        "runs_fixed.j2",
        {
            "bench_plan": rows,
            "bench_repetitions": reps,
            "bench_num_prompts_cap": cap,
            "bench_case_num_prompts": per_case,
        },
    )
    new = bench_plan.fixed_runs(rows, reps, cap, per_case, {}, 900, 10)
    return old, new


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("reps", [1, 3])
@pytest.mark.parametrize("cap", [0, 2, 100000])
def test_fixed_runs_equal_the_old_template(inventory: str, reps: int, cap: int) -> None:
    site = _site(inventory)
    rows = _scenario_rows()
    old, new = _fixed_both(rows, reps, cap, site.get("bench_case_num_prompts", {}))
    assert len(old) == len(rows) * reps
    assert _without_timeouts(new) == old
    assert [r["rel"] for r in new] == [r["rel"] for r in old]  # the same order


def test_the_cap_and_the_per_case_count_apply_as_before() -> None:
    rows = _scenario_rows("cold_prefill_4k,short_decode_c32")
    big = max(r["num_prompts"] for r in rows)
    for cap in (1, big - 1, big, big + 1):
        for per_case in ({}, {"short_decode_c32": 7}, {"cold_prefill_4k": "5"}):
            old, new = _fixed_both(rows, 2, cap, per_case)
            assert _without_timeouts(new) == old, (cap, per_case)
    capped = bench_plan.fixed_runs(rows, 1, 1, {"short_decode_c32": 7})
    assert [r["num_prompts"] for r in capped] == [1, 7]  # the override wins over the cap


def test_case_ids_filter_and_order() -> None:
    rows = _scenario_rows("short_decode_c1,cold_prefill_32k")
    old, new = _fixed_both(rows, 3, 0, {})
    assert _without_timeouts(new) == old
    assert [r["rel"] for r in new][:3] == [f"cases/{rows[0]['case_id']}/rep{n}" for n in (1, 2, 3)]


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("reps", [1, 3])
def test_mixed_runs_equal_the_old_template(inventory: str, reps: int) -> None:
    site = _site(inventory)
    old = _render(
        "runs_mixed.j2",
        {
            "mixed_decode": site["mixed_decode"],
            "mixed_injection": site["mixed_injection"],
            "mixed_repetitions": reps,
        },
    )
    new = bench_plan.mixed_runs(site["mixed_decode"], site["mixed_injection"], reps, {}, 900, 10)
    assert len(old) == 3 * reps
    assert _without_timeouts(new) == old


def test_every_run_carries_its_time_limits() -> None:
    rows = _scenario_rows("cold_prefill_4k,short_decode_c1")
    runs = bench_plan.fixed_runs(rows, 1, 0, {}, {"short_decode_c1": 40}, 300, 10)
    limits = {r["case_id"]: r["timeouts"] for r in runs}
    # The sums the task files spelled before: case + grace + 30 (module), + 60 (polls), + 120 (task).
    assert limits["cold_prefill_4k"] == {
        "case_s": 300,
        "kill_after_s": 10,
        "module_s": 340,
        "poll_retries": 370,
        "task_s": 430,
    }
    assert limits["short_decode_c1"]["case_s"] == 40
    assert limits["short_decode_c1"]["task_s"] == 170
    mixed = bench_plan.mixed_runs({"isl": 1}, {"isl": 2}, 1, {"mixed_prefill_injection": 5}, "300", "10")
    assert [r["timeouts"]["case_s"] for r in mixed] == [300, 300, 5]
    for run in runs + mixed:  # each net sits above the one inside it
        t = run["timeouts"]
        assert t["case_s"] + t["kill_after_s"] < t["module_s"] < t["poll_retries"] < t["task_s"]


def test_the_roles_read_the_limits_instead_of_summing_them() -> None:
    """No task file or template of the bench, mixed and labs roles adds a margin to a timeout itself."""
    files = [
        *REPO.glob("roles/bench/tasks/*.yml"),
        *REPO.glob("roles/bench/templates/*.j2"),
        *REPO.glob("roles/mixed/tasks/*.yml"),
        REPO / "roles" / "labs" / "tasks" / "run_loop.yml",
    ]
    for path in files:
        text = path.read_text()
        for spelled in ("kill_after_s | int) +", "bench_case_timeouts[", "labs_timeout_s | int) +"):
            assert spelled not in text, f"{path.relative_to(REPO)} still spells the timeout: {spelled!r}"


def test_a_reference_client_doubles_the_budget_above_the_clients() -> None:
    """With SGLang's or vLLM's client after loadgen, a case runs two clients under their own limits."""
    one = bench_plan.case_timeouts(300, 10)
    two = bench_plan.case_timeouts(300, 10, clients=2)
    assert (two["case_s"], two["kill_after_s"]) == (one["case_s"], one["kill_after_s"]) == (300, 10)
    for net in ("module_s", "poll_retries", "task_s"):
        assert two[net] - one[net] == 310, net
    [run] = bench_plan.fixed_runs(
        [{"case_id": "c", "num_prompts": 4}], 1, timeout_s=300, kill_after_s=10, clients=2
    )
    assert run["timeouts"] == two
