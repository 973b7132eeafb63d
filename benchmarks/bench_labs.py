"""Wall time of the lab suite on inventory/local (enginesim), per lab and in total, both flavours.

Runs the user's command, `ansible-playbook labs.yml -i inventory/local [-e engine_name=vllm]`, with the
inventory's workloads, in its own results root and on a free port, twice per flavour: once with the
nine mechanism labs (`--tags eager_vs_graph,...,ngram_spec`) and once with the four advanced labs
(quant_matrix, tp_scaling, sched_profile, pd_disagg; the P/D lab in a run of its own, on free ports of
its own: it refuses an engine_port given with -e). Per lab it prints its wall time from lab.json
(`wall_s`: from its plan to the last file its variants wrote; the judge's few seconds come after), its
variants and runs, the clients' own wall time (`client_s`, the runs' bench.json durations summed;
`other_s` = the rest: server starts and stops, checks, evidence, Ansible) and its verdict, each
playbook's total wall time (preflight and report included) and the box's load average before and
after. Targets: the nine mechanism labs together <= 10 minutes per flavour and each <= 2 minutes; each
advanced lab <= 3 minutes. The box is shared: quote the load average with the figures.

    .venv/bin/python benchmarks/bench_labs.py [--engines sglang,vllm] [--groups mechanism,advanced] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.ansible.runner import ansible_env, free_port  # noqa: E402

# The targets the issues set: the mechanism labs as one suite, the advanced labs one by one.
GROUPS = {
    "mechanism": (
        ("eager_vs_graph", "prefill_sweep", "decode_sweep", "prefix_cache", "chunk_interference",
         "token_budget", "kv_pressure", "fp8_kv", "ngram_spec"),
        600.0,  # the group's playbook wall time
        120.0,  # each lab
    ),
    "advanced": (("quant_matrix", "tp_scaling", "sched_profile", "pd_disagg"), None, 180.0),
}  # fmt: skip


def client_time(lab_dir: Path) -> tuple[int, int, float]:
    """Variants, runs and the clients' own wall seconds (bench.json `duration`, summed) of one lab: the
    rest of its wall time is orchestration (server starts and stops, checks, evidence, Ansible)."""
    plan = json.loads((lab_dir / "plan.json").read_text())
    runs, client = 0, 0.0
    for v in plan["variants"]:
        for r in v.get("runs", []):
            runs += 1
            bench = lab_dir / v["name"] / "runs" / r["name"] / "bench.json"
            if bench.is_file():
                client += float(json.loads(bench.read_text()).get("duration") or 0.0)
    return len(plan["variants"]), runs, client


def _invocations(labs: tuple[str, ...]) -> list[tuple[tuple[str, ...], dict]]:
    """The playbook runs for a group, each with its ports: the P/D lab starts three servers on ports of
    its own (labs_pd_ports) and refuses an engine_port given with -e (it would outrank them), so it runs
    apart, on free ports of its own."""
    rest = tuple(lab for lab in labs if lab != "pd_disagg")
    out = [(rest, {"engine_port": free_port()})] if rest else []
    if "pd_disagg" in labs:
        free: set[int] = set()
        while len(free) < 4:
            free.add(free_port())
        ports = dict(zip(("prefill", "decode", "router", "bootstrap"), sorted(free), strict=True))
        out.append((("pd_disagg",), {"labs_pd_ports": ports}))
    return out


def run(engine: str, group: str, root: Path) -> int:
    labs, suite_target, lab_target = GROUPS[group]
    pyz = root / "loadgen.pyz"
    subprocess.run([sys.executable, "-m", "loadgen.build_zipapp", str(pyz)], cwd=REPO, check=True)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    rcs, tails, labs_dirs = [], [], []
    for i, (tags, ports) in enumerate(_invocations(labs)):
        run_id = f"bench_{engine}_{i}"
        ev = {
            "quickmap_results_dir": str(root / "results"),
            "quickmap_loadgen_pyz": str(pyz),
            "engine_name": engine,
            "run_id": run_id,
            **ports,
        }
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "labs.yml", "-i", "inventory/local"]
        cmd += ["-e", json.dumps(ev), "--tags", ",".join(tags)]
        proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(), capture_output=True, text=True, check=False)
        rcs.append(proc.returncode)
        if proc.returncode != 0:
            tails.append("\n".join((proc.stdout + proc.stderr).splitlines()[-30:]))
        labs_dirs.append(root / "results" / run_id / "labs")
    suite_wall = time.monotonic() - t0
    load1 = os.getloadavg()
    target = f"target {suite_target:.0f} s" if suite_target else "no target for the group"
    print(
        f"\n{engine}, {group} labs: rc={max(rcs)}, playbook wall {suite_wall:.1f} s ({target}), "
        f"load average {load0[0]:.1f}/{load0[1]:.1f} before, {load1[0]:.1f}/{load1[1]:.1f} after"
    )
    print(f"{'lab':20} {'wall_s':>7} {'variants':>8} {'runs':>5} {'client_s':>8} {'other_s':>7}  verdict")
    worst = 0.0
    seen = set()
    did_not_run = []
    lab_jsons = [p for d in labs_dirs for p in d.glob("*/lab.json")]
    for lab_json in sorted(lab_jsons, key=lambda p: p.stat().st_mtime):
        doc = json.loads(lab_json.read_text())
        wall = doc.get("wall_s") or 0.0
        worst = max(worst, wall)
        seen.add(doc["lab"])
        variants, runs, client = client_time(lab_json.parent)
        flag = "" if wall <= lab_target else f"  (over the {lab_target:.0f} s target)"
        reason = str(doc.get("reason") or "")
        if doc["verdict"] == "inconclusive":
            flag += f"  ({reason[:200]})"
            if "did not run" in reason:
                did_not_run.append(doc["lab"])
        print(
            f"{doc['lab']:20} {wall:7.1f} {variants:8d} {runs:5d} {client:8.1f} {wall - client:7.1f}"
            f"  {doc['verdict']}{flag}"
        )
    missing = [lab for lab in labs if lab not in seen]
    if missing:
        print(f"no lab.json for: {', '.join(missing)}")
    if did_not_run:
        print(f"a variant did not run (the timing is not the lab's): {', '.join(did_not_run)}")
    for tail in tails:
        print(tail)
    suite_ok = suite_target is None or suite_wall <= suite_target
    ok = max(rcs) == 0 and not missing and not did_not_run and suite_ok and worst <= lab_target
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="sglang,vllm")
    ap.add_argument("--groups", default="mechanism,advanced", help="which lab groups (default: both)")
    ap.add_argument("--keep", action="store_true", help="keep the results directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="qm-bench-labs-"))
    rc = 0
    try:
        for engine in args.engines.split(","):
            for group in args.groups.split(","):
                if group not in GROUPS:
                    raise SystemExit(f"--groups: {group!r} is not one of {', '.join(GROUPS)}")
                rc |= run(engine, group, root / engine / group)
    finally:
        if args.keep:
            print(f"results kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
