"""Per-case orchestration overhead from ansible-runner job events (shared by the orchestration benchmarks).

A case is one item of a ``bench_case`` task (roles/bench/tasks/case.yml). Its wall time runs from the
end of the previous item of the same task (for the first item: the task's start event) to the end of
its own item, so everything Ansible does between two cases (templating, connection, module transfer,
the controller-side meta writes) is charged to a case. The client's share comes from its bench.json:
``duration`` is the main phase (what the issue calls the client's own benchmark duration),
``main_end_s`` adds the client's start-up to that (its time origin is set after argument parsing) and
its warm-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

BENCH_CASE_ACTIONS = ("bench_case", "quickmap.bench_case")


@dataclass(frozen=True)
class CaseWindow:
    rel: str
    start: float
    end: float
    items_in_task: int
    node_script_s: float | None  # the module's run of bench_cmd.txt (scrapes + client process)

    @property
    def wall(self) -> float:
        return self.end - self.start


def event_time(event: dict) -> float:
    """Unix time of a job event (``created`` is ISO-8601 UTC, with or without a zone suffix)."""
    stamp = datetime.fromisoformat(event["created"].replace("Z", "+00:00"))
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def case_windows(events: list[dict]) -> dict[str, CaseWindow]:
    """rel -> its window, for every item of every bench_case task that ran a case."""
    task_start: dict[str, float] = {}
    items: dict[str, list[tuple[float, str, float | None]]] = {}
    for event in events:
        data = event.get("event_data", {})
        if data.get("task_action") not in BENCH_CASE_ACTIONS:
            continue
        uuid = data.get("task_uuid", "")
        if event.get("event") == "playbook_on_task_start":
            task_start.setdefault(uuid, event_time(event))
        elif event.get("event") in ("runner_item_on_ok", "runner_item_on_failed"):
            res = data.get("res", {})
            case = res.get("case") or {}
            if "plugin_ended_epoch_s" not in res or case.get("passed") is None or "bench_run" not in res:
                continue
            items.setdefault(uuid, []).append(
                (float(res["plugin_ended_epoch_s"]), res["bench_run"]["rel"], case.get("wall_s"))
            )
    out: dict[str, CaseWindow] = {}
    for uuid, ends in items.items():
        prev = task_start.get(uuid)
        for end, rel, script in sorted(ends):
            if prev is not None:
                out[rel] = CaseWindow(rel, prev, end, len(ends), script)
            prev = end
    return out


def client_times(bench_json: Path) -> tuple[float, float]:
    """(main-phase duration, time origin to main end) of one result file, seconds."""
    data = json.loads(bench_json.read_text())
    duration = float(data.get("duration") or 0.0)
    return duration, float(data.get("main_end_s") or duration)
