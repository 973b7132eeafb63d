"""Orchestration overhead per case on the two-host rig (target: <= 1.5 s per case across two hosts).

Builds a rig (tests/rig: two network-namespace hosts, real SSH with pipelining + ControlPersist from the
project's ansible.cfg), runs the fixed suite with ansible-runner and reads its job events:

  case wall time  = from the start of the case's first task (task names end in `| cases/<id>/rep<N>`)
                    to the start of the first task after the case's last task (the next case, or what
                    follows the suite), so the gap between cases is charged to the case before it;
  client duration = the client's own run from its bench.json (`main_end_s`: warm-up + main phase,
                    measured by the client from its time origin);
  overhead        = case wall time - client duration.

Prints one line per case and the median overhead (medians: the box is shared, single runs are noisy).

    as root:  .venv/bin/python benchmarks/bench_rig_orchestration.py [--cases a,b] [--repetitions N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ansible_runner  # noqa: E402

from tests.rig.core import Rig, cleanup_stale, unavailable_reason  # noqa: E402

TARGET_S = 1.5


def event_time(event: dict) -> float:
    """Unix time of a job event (`created` is ISO-8601, UTC, no zone suffix)."""
    stamp = datetime.fromisoformat(event["created"].replace("Z", "+00:00"))
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def case_walls(events: list[dict], rels: list[str]) -> dict[str, float]:
    """Wall time per case rel from task-start events (see the module docstring for the boundaries)."""
    starts = [
        (event_time(e), e["event_data"].get("task", ""))
        for e in events
        if e.get("event") in ("playbook_on_task_start", "playbook_on_play_start", "playbook_on_stats")
    ]
    starts.append((max(event_time(e) for e in events), "__end__"))
    starts.sort()
    walls: dict[str, float] = {}
    for rel in rels:
        own = [i for i, (_, name) in enumerate(starts) if name.endswith(f"| {rel}")]
        if not own:
            continue
        after = next((t for t, name in starts[own[-1] + 1 :] if not name.endswith(f"| {rel}")), None)
        if after is not None:
            walls[rel] = after - starts[own[0]][0]
    return walls


def script_walls(events: list[dict]) -> dict[str, float]:
    """Wall time of each case's node-side script (metrics scrapes + client process), from the
    `QM_CASE rc=.. started_at=.. ended_at=..` line the bench role's case script prints."""
    walls: dict[str, float] = {}
    for event in events:
        if event.get("event") != "runner_on_ok":
            continue
        stdout = str((event["event_data"].get("res") or {}).get("stdout", ""))
        found = re.search(r"QM_CASE rc=\S+ started_at=(\S+) ended_at=(\S+)", stdout)
        task = event["event_data"].get("task", "")
        if found and "| " in task:
            start, end = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in found.groups())
            walls[task.rsplit("| ", 1)[1].strip()] = (end - start).total_seconds()
    return walls


def task_breakdown(events: list[dict], rel: str) -> list[tuple[str, float]]:
    """(task, seconds) for the tasks of one case, from consecutive task starts."""
    starts = sorted(
        (event_time(e), e["event_data"].get("task", ""))
        for e in events
        if e.get("event") in ("playbook_on_task_start", "playbook_on_play_start", "playbook_on_stats")
    )
    return [
        (name, nxt - t) for (t, name), (nxt, _) in itertools.pairwise(starts) if name.endswith(f"| {rel}")
    ]


def client_duration(bench_json: Path) -> float:
    """The client's own run time: warm-up + main phase (`main_end_s` from its time origin)."""
    data = json.loads(bench_json.read_text())
    return float(data.get("main_end_s") or data["duration"])


def main() -> int:
    """Build a rig, run the fixed suite, print per-case overhead and the median; exit 1 above target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cold_prefill_4k,short_decode_c1")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="per-task times of the last case")
    parser.add_argument("--time-scale", default=None, help="enginesim time scale (default: the rig's)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"rig unavailable: {reason}", file=sys.stderr)
        return 2
    if not (REPO / "build" / "loadgen.pyz").exists():
        print("build/loadgen.pyz missing: run `make zipapp` first", file=sys.stderr)
        return 2
    cleanup_stale()
    rig = Rig.create().up()
    try:
        run_id = f"bench-orch-{int(time.time())}"
        wanted = ("ANSIBLE_", "LC_", "LANG", "PATH")
        env = {k: v for k, v in rig.ansible_env().items() if k.startswith(wanted)}
        with tempfile.TemporaryDirectory(prefix="qm-bench-runner-") as pdd:
            started = time.monotonic()
            result = ansible_runner.run(
                private_data_dir=pdd,
                project_dir=str(REPO),
                playbook="quick_map.yml",
                inventory=str(rig.inventory),
                extravars={
                    "run_id": run_id,
                    "case_ids": args.cases,
                    "repetitions": args.repetitions,
                    **({"time_scale": args.time_scale} if args.time_scale else {}),
                },
                cmdline="--tags fixed",
                envvars=env,
                quiet=True,
                suppress_env_files=True,
            )
            total = time.monotonic() - started
            events = list(result.events)
        run_dir = rig.path / "controller" / "results" / run_id
        if result.status != "successful":
            print(f"playbook {result.status} (rc {result.rc}); see {run_dir}", file=sys.stderr)
            return 1
        rels = sorted(str(p.parent.relative_to(run_dir)) for p in run_dir.glob("cases/*/rep*/bench.json"))
        walls = case_walls(events, rels)
        scripts = script_walls(events)
        overheads, ansible_share = [], []
        for rel in rels:
            if rel not in walls:
                continue
            client = client_duration(run_dir / rel / "bench.json")
            overheads.append(walls[rel] - client)
            line = (
                f"{rel:30s} wall {walls[rel]:5.2f} s  client {client:5.2f} s  overhead {overheads[-1]:5.2f} s"
            )
            if rel in scripts:
                ansible_share.append(walls[rel] - scripts[rel])
                line += f"  (node script {scripts[rel]:5.2f} s, Ansible {ansible_share[-1]:5.2f} s)"
            print(line)
        if not overheads:
            print("no case could be timed from the job events", file=sys.stderr)
            return 1
        if args.verbose:
            print(f"tasks of {rels[-1]}:")
            for name, secs in task_breakdown(events, rels[-1]):
                print(f"    {secs:5.2f} s  {name}")
        median = statistics.median(overheads)
        print(f"playbook wall (--tags fixed, {len(overheads)} case runs, 2 hosts): {total:.1f} s")
        print(
            f"orchestration overhead per case on the rig: median {median:.2f} s "
            f"(min {min(overheads):.2f}, max {max(overheads):.2f}); target <= {TARGET_S} s"
        )
        if ansible_share:
            print(
                "  of which Ansible (case wall - node script wall): median "
                f"{statistics.median(ansible_share):.2f} s;"
                " the rest is the client's start-up and prompt preparation and the two /metrics scrapes"
            )
        return 0 if median <= TARGET_S else 1
    finally:
        rig.down()


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C.UTF-8")
    sys.exit(main())
