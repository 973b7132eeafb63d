"""Orchestration overhead per case on the two-host rig (target: <= 1.5 s per case across two hosts).

Builds a rig (tests/rig: two network-namespace hosts, real SSH with pipelining + ControlPersist from the
project's ansible.cfg), runs the fixed suite with ansible-runner and reads its job events with
`case_overhead.py`:

  case wall time  = from the end of the previous case (for the first: the start of the bench_case task)
                    to the end of this case's item, so the work between cases is charged to a case;
  client duration = the client's own main phase (`duration` in its bench.json); the figure against the
                    client's whole run (`main_end_s`: start-up + warm-up + main) is printed too;
  overhead        = case wall time - client duration.

Prints one line per case and the median overhead (medians: the box is shared, single runs are noisy).

    as root:  .venv/bin/python benchmarks/bench_rig_orchestration.py [--cases a,b] [--repetitions N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ansible_runner  # noqa: E402

from benchmarks.case_overhead import case_windows, client_times  # noqa: E402
from tests.rig.core import Rig, cleanup_stale, unavailable_reason  # noqa: E402

TARGET_S = 1.5


def main() -> int:
    """Build a rig, run the fixed suite, print per-case overhead and the median; exit 1 above target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cold_prefill_4k,short_decode_c1")
    parser.add_argument("--repetitions", type=int, default=3)
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
        windows = case_windows(events)
        overheads, vs_whole_run, ansible_share = [], [], []
        for rel, w in sorted(windows.items(), key=lambda kv: kv[1].start):
            if not (run_dir / rel / "bench.json").is_file():
                continue
            duration, whole_run = client_times(run_dir / rel / "bench.json")
            overheads.append(w.wall - duration)
            vs_whole_run.append(w.wall - whole_run)
            line = (
                f"{rel:30s} wall {w.wall:5.2f} s  client {duration:5.2f} s  overhead {overheads[-1]:5.2f} s"
            )
            if w.node_script_s is not None:
                ansible_share.append(w.wall - w.node_script_s)
                line += f"  (node script {w.node_script_s:5.2f} s, Ansible {ansible_share[-1]:5.2f} s)"
            print(line)
        if not overheads:
            print("no case could be timed from the job events", file=sys.stderr)
            return 1
        median = statistics.median(overheads)
        print(f"playbook wall (--tags fixed, {len(overheads)} case runs, 2 hosts): {total:.1f} s")
        print(
            f"orchestration overhead per case on the rig: median {median:.2f} s "
            f"(min {min(overheads):.2f}, max {max(overheads):.2f}); target <= {TARGET_S} s"
        )
        print(
            "  against the client's whole run (start-up + warm-up + main): median "
            f"{statistics.median(vs_whole_run):.2f} s"
        )
        if ansible_share:
            print(
                "  of which Ansible (case wall - node script wall): median "
                f"{statistics.median(ansible_share):.2f} s;"
                " the rest is the client's start-up, prompts and warm-up, and the two /metrics scrapes"
            )
        return 0 if median <= TARGET_S else 1
    finally:
        rig.down()


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C.UTF-8")
    sys.exit(main())
