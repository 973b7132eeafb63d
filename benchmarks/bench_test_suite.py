"""Wall time and CPU of the test suite as `make test` runs it, and where they go.

Runs `pytest -q -n WORKERS` (make test's command) with a per-test accounting plugin, then prints:
the suite's wall time against the target (#17: <= 6 min on this 2-core box), the box's CPU busy
share over the run, the CPU the tests used, the two floors under the wall time (the longest unit,
and the counted CPU over the cores), and the units (a file, or what tests/conftest.py splits off)
by CPU and by wall time. Exit status 1 when the target is missed or pytest failed.

    .venv/bin/python benchmarks/bench_test_suite.py [--workers 2] [--top 25] [-- PYTEST_ARGS...]

Counted CPU covers pytest's workers and every process they reaped (playbooks, modules, clients); a
server left running in the background is in the box's busy share only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import unit_of  # noqa: E402

TARGET_S = 360.0


def box_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def read_records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(out_dir.glob("*.jsonl")) for line in path.open()]


def unit_table(records: list[dict]) -> list[dict]:
    """One row per scheduling unit: its tests, wall time and counted CPU, most CPU first."""
    units: dict[str, dict] = collections.defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0})
    for r in records:
        u = units[unit_of(r["nodeid"])]
        u["tests"] += 1
        u["wall_s"] += r["wall_s"]
        u["cpu_s"] += r["cpu_own_s"] + r["cpu_children_s"]
    rows = [{"unit": name, **u} for name, u in units.items()]
    return sorted(rows, key=lambda u: -u["cpu_s"])


def verdict(wall_s: float, target_s: float, pytest_rc: int) -> int:
    """0 when pytest passed within the target; otherwise say which and return 1."""
    if pytest_rc != 0:
        print(f"FAILED  pytest exited {pytest_rc}: the timing is not of a green suite")
        return 1
    if wall_s > target_s:
        print(f"MISSED  test suite wall {wall_s:.0f} s > target {target_s:.0f} s")
        return 1
    print(f"MET     test suite wall {wall_s:.0f} s <= target {target_s:.0f} s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=int(os.environ.get("PYTEST_WORKERS", "2")))
    ap.add_argument("--top", type=int, default=25, help="units listed (default 25)")
    ap.add_argument("--json", type=Path, help="also write every test's record and the totals here")
    ap.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments (e.g. a path)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="qm-suite-cpu-") as tmp:
        env = dict(os.environ, QUICKMAP_CPU_ACCOUNTING_DIR=tmp, PYTHONPATH=str(REPO))
        cmd = [str(REPO / ".venv/bin/pytest"), "-q", "-n", str(args.workers)]
        cmd += ["-p", "benchmarks.pytest_cpu_accounting", "-p", "no:cacheprovider", *args.pytest_args]
        load = os.getloadavg()[0]
        busy0, total0 = box_cpu_ticks()
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
        wall = time.monotonic() - t0
        busy1, total1 = box_cpu_ticks()
        records = read_records(Path(tmp))

    cores = os.cpu_count() or 1
    busy_share = (busy1 - busy0) / max(total1 - total0, 1)
    units = unit_table(records)
    counted = sum(u["cpu_s"] for u in units)
    longest = max(units, key=lambda u: u["wall_s"]) if units else {"unit": "-", "wall_s": 0.0}
    print(f"\n== test suite: pytest -n {args.workers}, {len(records)} tests, load avg {load:.1f} at start")
    busy_cpu = busy_share * cores * wall
    print(f"wall {wall:.0f} s; box CPU busy {busy_share:.0%} of {cores} cores ({busy_cpu:.0f} CPU-s)")
    print(f"counted CPU {counted:.0f} s: floor {counted / cores:.0f} s of wall on {cores} cores")
    print(f"longest unit {longest['wall_s']:.0f} s: {longest['unit']}")
    print(f"\n{'CPU s':>8} {'wall s':>8} {'tests':>5}  unit (most CPU first)")
    for u in units[: args.top]:
        print(f"{u['cpu_s']:8.1f} {u['wall_s']:8.1f} {u['tests']:5d}  {u['unit']}")
    if args.json:
        totals = {"wall_s": wall, "busy_share": busy_share, "cores": cores, "counted_cpu_s": counted}
        args.json.write_text(json.dumps({"totals": totals, "units": units, "tests": records}, indent=1))
    return verdict(wall, TARGET_S, rc)


if __name__ == "__main__":
    sys.exit(main())
