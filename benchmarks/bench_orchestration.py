"""Orchestration overhead of the quick map on inventory/local, from ansible-runner job events.

Runs `quick_map.yml` through ansible-runner (enginesim, the real client zipapp, the real roles) and,
for every case run (fixed cases and the mixed control/injection), computes

    overhead = case wall time - the client's own `duration` (main phase, from bench.json)

with the case windows of `case_overhead.py` (from the end of the previous case to the end of this one,
so Ansible's work between cases is counted). Also printed per case: the node-side script wall time
(the two /metrics scrapes + the client process, as the bench_case module measured it), so the part
that is Ansible and the part that is client start-up + warm-up can be told apart, and the full-map
wall time. Target: median overhead <= 1.0 s per case.

    .venv/bin/python benchmarks/bench_orchestration.py [--case-ids a,b] [--repetitions N] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.case_overhead import case_windows, client_times
from tests.ansible.runner import base_extravars, free_port, run_runner, zipapp_path

TARGET_S = 1.0


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
    for rel, w in sorted(windows.items(), key=lambda kv: kv[1].start):
        if not (run_dir / rel / "bench.json").is_file():
            continue
        duration, _ = client_times(run_dir / rel / "bench.json")
        script = w.node_script_s or 0.0
        rows.append((rel, w.wall, duration, script, w.wall - duration, w.wall - script))
    if not rows:
        print("no case windows found (did the run fail? see the runner artifacts)")
        return 1
    head = ("case", "wall s", "client s", "script s", "overhead s", "ansible s")
    print(f"{head[0]:46} {head[1]:>8} {head[2]:>9} {head[3]:>9} {head[4]:>10} {head[5]:>10}")
    for rel, wall_s, client_s, script_s, over_s, ans_s in rows:
        print(f"{rel:46} {wall_s:8.2f} {client_s:9.2f} {script_s:9.2f} {over_s:10.2f} {ans_s:10.2f}")
    med = statistics.median(row[4] for row in rows)
    med_ans = statistics.median(row[5] for row in rows)
    print(
        f"median orchestration overhead per case (wall - client duration): {med:.2f} s"
        f"  (target <= {TARGET_S} s)"
    )
    print(f"median Ansible part (wall - node script wall):                 {med_ans:.2f} s")
    print(f"cases: {len(rows)}   full-map wall time: {wall:.1f} s")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if med <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
