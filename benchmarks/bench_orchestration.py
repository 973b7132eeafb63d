"""Orchestration overhead of the quick map on inventory/local, from ansible-runner job events.

Runs `quick_map.yml` through ansible-runner (enginesim, the real client zipapp, the real roles) and,
for every case run (fixed cases and the mixed control/injection), computes

    overhead = case wall time - the client's own `duration` (main phase, from bench.json)

A case is one item of a `bench_case` task. Its wall time runs from the end of the previous item of
the same task (or, for the first item, the task's start event) to the end of its own item, so the
per-item work Ansible does between cases (templating, connection, module transfer) is counted too.
Also printed per case: the client process wall time (bench_cmd.txt start..end, from meta.json), so the
part that is Ansible and the part that is client start-up + warm-up can be told apart, and the
full-map wall time. Target: median overhead <= 1.0 s per case.

    .venv/bin/python benchmarks/bench_orchestration.py [--case-ids a,b] [--repetitions N] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ansible.runner import base_extravars, free_port, run_runner, zipapp_path


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=dt.UTC).timestamp()


def case_windows(events: list[dict]) -> dict[str, tuple[float, float, int]]:
    """rel -> (window start, window end, items of its task) for every bench_case item."""
    task_start: dict[str, float] = {}
    items: dict[str, list[tuple[float, str]]] = {}
    for ev in events:
        data = ev.get("event_data", {})
        if data.get("task_action") not in ("bench_case", "quickmap.bench_case"):
            continue
        uuid = data.get("task_uuid", "")
        if ev.get("event") == "playbook_on_task_start":
            task_start.setdefault(uuid, _ts(ev["created"]))
        elif ev.get("event") in ("runner_item_on_ok", "runner_item_on_failed"):
            res = data.get("res", {})
            if "plugin_ended_epoch_s" in res and (res.get("case") or {}).get("passed") is not None:
                end = float(res["plugin_ended_epoch_s"])
                items.setdefault(uuid, []).append((end, res["bench_run"]["rel"]))
    out: dict[str, tuple[float, float, int]] = {}
    for uuid, ends in items.items():
        prev = task_start.get(uuid)
        for end, rel in sorted(ends):
            if prev is not None:
                out[rel] = (prev, end, len(ends))
            prev = end
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case-ids", default="", help="subset of the scenario table (default: all 11)")
    ap.add_argument("--repetitions", type=int, default=1)
    ap.add_argument("--tags", default=None, help="e.g. fixed (default: the full map incl. the mixed A/B)")
    ap.add_argument("--keep", action="store_true", help="keep the results directory")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="qm-bench-orch-"))
    results = tmp / "results"
    extravars = base_extravars(
        results, zipapp_path(tmp), free_port(), run_id="bench", repetitions=args.repetitions
    )
    if args.case_ids:
        extravars["case_ids"] = args.case_ids
    t0 = time.monotonic()
    r = run_runner(tmp / "runner", extravars, tags=args.tags, timeout=1800)
    wall = time.monotonic() - t0
    print(f"ansible-runner status={r.status} rc={r.rc}  full-map wall time {wall:.1f} s  ({tmp})")
    windows = case_windows(list(r.events))
    run_dir = results / "bench"
    rows = []
    for rel, (start, end, nitems) in sorted(windows.items(), key=lambda kv: kv[1][0]):
        case_dir = run_dir / rel
        try:
            bench = json.loads((case_dir / "bench.json").read_text())
            meta = json.loads((case_dir / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("role") == "decode_background":  # overlaps other tasks by design: no case window
            continue
        client_main = float(bench.get("duration") or 0.0)
        proc = (
            _ts(meta["ended_at"]) - _ts(meta["started_at"])
            if meta.get("started_at") and meta.get("ended_at")
            else 0.0
        )
        rows.append(
            (rel, end - start, client_main, proc, nitems, end - start - client_main, end - start - proc)
        )
    if not rows:
        print("no case windows found (did the run fail? see the runner artifacts)")
        return 1
    head = ("case", "wall s", "client s", "proc s", "items", "overhead s", "ansible-only s")
    print(f"{head[0]:46} {head[1]:>8} {head[2]:>9} {head[3]:>7} {head[4]:>5} {head[5]:>10} {head[6]:>14}")
    for rel, w, c, p, n, ov, ans in rows:
        print(f"{rel:46} {w:8.2f} {c:9.2f} {p:7.2f} {n:5d} {ov:10.2f} {ans:14.2f}")
    med = statistics.median(r[5] for r in rows)
    med_ans = statistics.median(r[6] for r in rows)
    print(f"median orchestration overhead per case (wall - client duration): {med:.2f} s  (target <= 1.0 s)")
    print(f"median Ansible-only part (wall - client process wall):          {med_ans:.2f} s")
    print(f"cases: {len(rows)}   full-map wall time: {wall:.1f} s")
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
